"""``@record``: a dataclass whose ``__repr__``, ``__eq__`` and ``__hash__`` are closures, not compiled code.

``dataclasses`` compiles every method it generates, for every class, when the module is imported (an
``exec`` each, about 0.07 ms on CPython 3.11). ``launcher run`` imports some forty dataclasses before
its first rank starts, and their ``__repr__``, ``__eq__`` and ``__hash__`` were about 8 ms of its
start-up (the self times of ``python -X importtime -m launcher run``, 2 cores). Those three need no
code of their own per class: the ones made here give what ``dataclasses`` generates (the same text,
the same equality, the same hash, from the same fields: tests/unit/common/test_records.py compares
the two on every record of the launcher). ``__init__`` and a frozen record's ``__setattr__`` and
``__delattr__`` are ``dataclasses``' own.

Comparing and hashing cost about what the generated methods cost (0.24 and 0.18 us against 0.15
and 0.14 for three fields); ``repr``, rarely called, about 1.4 times as much.
"""

import dataclasses
import operator
import reprlib
from typing import Any, Callable, Tuple

_MISSING = object()


def record(cls: Any = None, *, frozen: bool = False) -> Any:
    """``@dataclasses.dataclass`` (or ``@dataclasses.dataclass(frozen=True)``) with ``__repr__``,
    ``__eq__`` and, frozen, ``__hash__`` made without compiling.

    A class's own ``__repr__``, ``__eq__`` or ``__hash__`` is kept, as ``dataclass`` keeps it, and a
    mutable record is unhashable, as a dataclass with ``eq`` is.
    """

    def wrap(cls: Any) -> Any:
        own = dict(vars(cls))
        cls = dataclasses.dataclass(cls, frozen=frozen, repr=False, eq=False)
        fields = dataclasses.fields(cls)
        if "__repr__" not in own:
            cls.__repr__ = _repr_fn(cls, tuple(f.name for f in fields if f.repr))
        if "__eq__" not in own:
            cls.__eq__ = _eq_fn(cls, tuple(f.name for f in fields if f.compare))
        own_hash = own.get("__hash__", _MISSING)
        if own_hash is _MISSING or (own_hash is None and "__eq__" in own):  # dataclass's rule, with eq
            hashed = tuple(f.name for f in fields if (f.compare if f.hash is None else f.hash))
            cls.__hash__ = _hash_fn(cls, hashed) if frozen else None
        return cls

    return wrap if cls is None else wrap(cls)


def _getter(names: Tuple[str, ...]) -> Callable[[Any], Tuple[Any, ...]]:
    """The tuple of ``names``' values, as dataclass's methods build it (``attrgetter`` of two or more
    names makes it in C; of one name it gives the bare value)."""
    if len(names) > 1:
        return operator.attrgetter(*names)
    return lambda obj: tuple(getattr(obj, name) for name in names)


def _named(cls: Any, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    fn.__name__, fn.__qualname__ = name, f"{cls.__qualname__}.{name}"
    return fn


def _repr_fn(cls: Any, names: Tuple[str, ...]) -> Callable[[Any], str]:
    @reprlib.recursive_repr()  # a record that holds itself shows "...", as dataclass's repr does
    def __repr__(self: Any) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in names)
        return f"{self.__class__.__qualname__}({shown})"

    return _named(cls, "__repr__", __repr__)


def _eq_fn(cls: Any, names: Tuple[str, ...]) -> Callable[[Any, Any], Any]:
    values = _getter(names)

    def __eq__(self: Any, other: Any) -> Any:
        if other.__class__ is self.__class__:
            return values(self) == values(other)  # tuples, as dataclass compares: x is x counts as equal
        return NotImplemented

    return _named(cls, "__eq__", __eq__)


def _hash_fn(cls: Any, names: Tuple[str, ...]) -> Callable[[Any], int]:
    values = _getter(names)

    def __hash__(self: Any) -> int:
        return hash(values(self))

    return _named(cls, "__hash__", __hash__)
