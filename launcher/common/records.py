"""``@record``: a dataclass none of whose methods is compiled when its module is imported.

``dataclasses`` compiles every method it generates, for every class, when the module is imported (an
``exec`` each, about 0.07-0.3 ms on CPython 3.11). ``launcher run`` imports some fifty dataclasses
before its first rank starts; compiling their methods was 17 ms of its start-up (docs/benchmarks.md,
"Launch, a fifth look"), and most of those classes are never instantiated before the ranks run, many
never in a run. A record makes:

- ``__repr__``, ``__eq__`` and, frozen, ``__hash__``: closures over the field names, not compiled
  code. They give what ``dataclasses`` generates (the same text, the same equality, the same hash,
  from the same fields).
- a frozen record's ``__setattr__`` and ``__delattr__``: closures with the generated methods' test.
- ``__init__``: the generated one's parameters and body. A class's first :data:`COMPILE_AFTER`
  instances are made by a stand-in that binds the arguments by the fields' description, without
  compiling anything (most records are made a few times per run, many never); then the class gets the
  compiled ``__init__``, as fast as ``dataclasses``' own. Arguments the stand-in cannot bind go to
  the compiled one at once, which raises ``dataclasses``' ``TypeError``. Until a class was compiled,
  ``inspect.signature`` of it shows the stand-in's ``(*args, **kwargs)``.

tests/unit/common/test_records.py compares each of these with ``dataclasses``' own, on every record of
the launcher. ``dataclasses`` still collects the fields (``fields``, ``replace``, ``asdict`` work as
on any dataclass); a record with dataclass bases is made wholly by ``dataclasses`` except its
``__repr__``, ``__eq__`` and ``__hash__``, and ``InitVar`` fields are refused.

Comparing and hashing cost about what the generated methods cost (0.24 and 0.18 us against 0.15
and 0.14 for three fields); ``repr``, rarely called, about 1.4 times as much.
"""

import dataclasses
import operator
import reprlib
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Sequence, Tuple

_MISSING = object()
#: Instances a record's stand-in ``__init__`` makes before the class gets the compiled one.
COMPILE_AFTER = 8


class _Factory:
    """An ``__init__`` parameter's default that means "call the field's default factory"."""

    def __repr__(self) -> str:
        return "<factory>"  # as dataclasses shows it in a signature


_FACTORY = _Factory()


def record(cls: Any = None, *, frozen: bool = False) -> Any:
    """``@dataclasses.dataclass`` (or ``@dataclasses.dataclass(frozen=True)``) without compiling its
    methods at import.

    A class's own ``__init__``, ``__repr__``, ``__eq__`` or ``__hash__`` is kept, as ``dataclass``
    keeps it, a frozen record may not define ``__setattr__`` or ``__delattr__``, and a mutable record
    is unhashable, as a dataclass with ``eq`` is.
    """

    def wrap(cls: Any) -> Any:
        own = dict(vars(cls))
        based = any(dataclasses.is_dataclass(base) for base in cls.__mro__[1:])
        if based:  # dataclasses' checks of frozen and mutable bases, and its compiled methods
            cls = dataclasses.dataclass(cls, frozen=frozen, repr=False, eq=False)
        else:
            cls = dataclasses.dataclass(cls, init=False, repr=False, eq=False)
            _lazy_methods(cls, own, frozen)
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


def _lazy_methods(cls: Any, own: Dict[str, Any], frozen: bool) -> None:
    """The stand-in ``__init__``, a frozen record's guards, and what ``dataclasses`` says of the class:
    what it would say had it made all of them."""
    fields = dataclasses.fields(cls)
    if len(fields) != len(cls.__dataclass_fields__):
        pseudo = [f for f in cls.__dataclass_fields__.values() if f not in fields]
        if any(isinstance(f.type, dataclasses.InitVar) or "InitVar" in str(f.type) for f in pseudo):
            raise TypeError(f"{cls.__qualname__}: a record takes no InitVar fields")
    _check_order(fields)
    if "__init__" not in own:
        cls.__init__ = _lazy_init(cls, fields, frozen)
    if frozen:
        for name in ("__setattr__", "__delattr__"):
            if name in own:
                raise TypeError(f"Cannot overwrite attribute {name} in class {cls.__name__}")
        cls.__setattr__, cls.__delattr__ = _frozen_fns(cls, frozen_names=tuple(f.name for f in fields))
    params = cls.__dataclass_params__
    params.init, params.repr, params.eq, params.frozen = True, True, True, frozen


def _check_order(fields: Sequence[dataclasses.Field]) -> None:
    """``dataclass``'s check, made when it would compile ``__init__``."""
    seen_default = False
    for f in fields:
        if f.init and not getattr(f, "kw_only", False):
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
                seen_default = True
            elif seen_default:
                raise TypeError(f"non-default argument {f.name!r} follows default argument")


def _lazy_init(cls: Any, described: Sequence[dataclasses.Field], frozen: bool) -> Callable[..., None]:
    """The stand-in: binds its first :data:`COMPILE_AFTER` calls' arguments from ``described``."""
    fields = [(f.name, f.init, f.default, f.default_factory) for f in described]
    positional = tuple(f.name for f in described if f.init and not getattr(f, "kw_only", False))
    accepted = frozenset(name for name, init, _, _ in fields if init)
    required = frozenset(name for name, init, default, factory in fields
                         if init and default is dataclasses.MISSING and factory is dataclasses.MISSING)
    assign = object.__setattr__ if frozen else setattr
    post_init = hasattr(cls, "__post_init__")
    made = [0]

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        made[0] += 1
        values = _bind(positional, accepted, required, args, kwargs) if made[0] <= COMPILE_AFTER else None
        if values is None:  # made often, or arguments dataclasses would refuse (its TypeError)
            cls.__init__ = compiled = init_fn(cls, frozen)
            compiled(self, *args, **kwargs)
            return
        for name, init, default, factory in fields:
            value = values.get(name, _MISSING) if init else _MISSING
            if value is _MISSING:
                if factory is not dataclasses.MISSING:
                    value = factory()
                elif not init:
                    continue  # not in __init__ and no factory: the class attribute is its value
                else:
                    value = default
            assign(self, name, value)
        if post_init:
            self.__post_init__()

    return _named(cls, "__init__", __init__)


def _bind(positional: Tuple[str, ...], accepted: FrozenSet[str], required: FrozenSet[str],
          args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """Field name -> value given, as the compiled ``__init__`` binds them; None where it would raise
    (too many, unknown, repeated or missing arguments)."""
    if len(args) > len(positional):
        return None
    values = dict(zip(positional, args))
    for name, value in kwargs.items():
        if name in values or name not in accepted:
            return None
        values[name] = value
    return values if required.issubset(values) else None


def init_fn(cls: Any, frozen: bool) -> Callable[..., None]:
    """The ``__init__`` ``dataclasses`` generates for ``cls``: the same parameters, defaults and
    assignments, then ``__post_init__`` if the class has one."""
    names: Dict[str, Any] = {"__record_factory__": _FACTORY, "__record_set__": object.__setattr__}
    params: List[str] = []
    keywords: List[str] = []
    body: List[str] = []
    fields = dataclasses.fields(cls)
    for f in fields:
        value = _init_value(f, names, params if not getattr(f, "kw_only", False) else keywords)
        if value is not None:
            body.append(f"__record_set__(self, {f.name!r}, {value})" if frozen else f"self.{f.name} = {value}")
    if hasattr(cls, "__post_init__"):
        body.append("self.__post_init__()")
    signature = ", ".join(["self"] + params + (["*"] + keywords if keywords else []))
    text = f"def __init__({signature}):\n" + "".join(f" {line}\n" for line in body or ["pass"])
    exec(text, names)  # noqa: S102 - the text is made of field names and fixed words only
    fn = names["__init__"]
    fn.__annotations__ = {**{f.name: f.type for f in fields if f.init}, "return": None}
    return _named(cls, "__init__", fn)


def _init_value(f: dataclasses.Field, names: Dict[str, Any], params: List[str]) -> Any:
    """The expression ``__init__`` assigns to field ``f`` (None: no assignment, as a field without
    ``init`` and without a factory reads its class attribute); adds ``f``'s parameter to ``params``."""
    default = f"__record_default_{f.name}__"
    if f.default_factory is not dataclasses.MISSING:
        names[default] = f.default_factory
        if not f.init:
            return f"{default}()"
        params.append(f"{f.name}=__record_factory__")
        return f"{default}() if {f.name} is __record_factory__ else {f.name}"
    if not f.init:
        return None
    if f.default is dataclasses.MISSING:
        params.append(f.name)
    else:
        names[default] = f.default
        params.append(f"{f.name}={default}")
    return f.name


def _frozen_fns(cls: Any, frozen_names: Tuple[str, ...]) -> Tuple[Callable[..., None], Callable[..., None]]:
    """The guards ``dataclasses`` compiles for a frozen class, as closures."""

    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is cls or name in frozen_names:
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)

    def __delattr__(self: Any, name: str) -> None:
        if type(self) is cls or name in frozen_names:
            raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)

    return _named(cls, "__setattr__", __setattr__), _named(cls, "__delattr__", __delattr__)


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
