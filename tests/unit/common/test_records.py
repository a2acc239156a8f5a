"""``@record`` against ``@dataclass``: the same text, equality and hash, on the same classes."""

import dataclasses
import importlib
import math
import pkgutil
from typing import Any, List, Optional, Tuple

import pytest
from hypothesis import given, settings, strategies as st

import launcher
from launcher.common.records import record


def point_classes(frozen: bool):
    """The same class body, once as a dataclass and once as a record (same name, same qualname)."""

    def make(decorate):
        class Point:
            x: Any
            y: Any = 0
            hidden: Any = dataclasses.field(default=None, repr=False)
            note: Any = dataclasses.field(default="", compare=False)
            unhashed: Any = dataclasses.field(default=1, hash=False)
            hashed_only: Any = dataclasses.field(default=2, compare=False, hash=True)
            tags: List[Any] = dataclasses.field(default_factory=list, compare=False)

            @property
            def total(self) -> Any:
                return (self.x, self.y)

        return decorate(Point)

    return make(dataclasses.dataclass(frozen=frozen)), make(record(frozen=frozen))


VALUES = st.one_of(st.none(), st.integers(-3, 3), st.floats(allow_nan=True), st.text(max_size=3),
                   st.tuples(st.integers(0, 2), st.text(max_size=2)))


@settings(max_examples=300, deadline=None, database=None)
@given(st.booleans(), st.lists(VALUES, min_size=12, max_size=12))
def test_a_record_shows_compares_and_hashes_as_the_dataclass(frozen, values):
    ours, theirs = point_classes(frozen)[1], point_classes(frozen)[0]

    def pair(cls):
        a = cls(values[0], values[1], values[2], values[3], values[4], values[5])
        b = cls(values[6], values[7], values[8], values[9], values[10], values[11])
        return a, b

    (a, b), (a2, b2) = pair(ours), pair(theirs)
    assert repr(a) == repr(a2) and repr(b) == repr(b2)
    assert (a == b, a != b, a == a, b == b) == (a2 == b2, a2 != b2, a2 == a2, b2 == b2)
    assert (a == a2, a == object(), a.__eq__(object())) == (False, False, NotImplemented)
    if frozen:
        hashes = [_hash(x) for x in (a, b)], [_hash(x) for x in (a2, b2)]
        assert hashes[0] == hashes[1]
    else:
        assert ours.__hash__ is None and theirs.__hash__ is None  # mutable: unhashable, as dataclass makes it


def _hash(obj: Any) -> Optional[int]:
    try:
        return hash(obj)
    except TypeError:  # a list among the values: neither can hash it
        return None


def test_not_a_number_equals_itself_in_a_record_as_in_a_dataclass():
    nan = math.nan
    for cls in point_classes(True):
        assert cls(nan) == cls(nan)  # the same object: tuples compare it by identity first


def test_a_record_that_holds_itself_shows_dots():
    for cls in point_classes(False):
        point = cls(1)
        point.tags.append(point)
        assert repr(point) == f"{cls.__qualname__}(x=1, y=0, note='', unhashed=1, hashed_only=2, tags=[...])"


def test_frozen_records_stay_frozen_and_replace_works():
    cls = point_classes(True)[1]
    point = cls(1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        point.x = 2
    assert dataclasses.replace(point, x=2) == cls(2)
    assert dataclasses.asdict(point)["x"] == 1


def classes_with_own_methods(frozen: bool):
    def make(decorate):
        class Own:
            value: int
            other: int = 0

            def __repr__(self) -> str:
                return f"own {self.value}"

            def __eq__(self, other: Any) -> bool:
                return isinstance(other, Own) and other.value == self.value

        return decorate(Own)

    return make(dataclasses.dataclass(frozen=frozen)), make(record(frozen=frozen))


@pytest.mark.parametrize("frozen", [True, False])
def test_a_class_keeps_its_own_methods_and_gets_the_dataclass_hash(frozen):
    theirs, ours = classes_with_own_methods(frozen)
    assert repr(ours(1)) == repr(theirs(1)) == "own 1"
    assert (ours(1, 2) == ours(1, 3)) and (theirs(1, 2) == theirs(1, 3))
    if frozen:  # dataclass hashes the fields of a frozen class that has only its own __eq__
        assert hash(ours(1, 2)) == hash(theirs(1, 2)) == hash((1, 2))
    else:
        assert ours.__hash__ is None and theirs.__hash__ is None


def _launcher_records() -> List[type]:
    found = {}
    for info in pkgutil.walk_packages(launcher.__path__, "launcher."):
        if info.name.startswith(("launcher.rankhooks", "launcher.__main__")):
            continue
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if isinstance(value, type) and dataclasses.is_dataclass(value) \
                    and getattr(value.__repr__, "__module__", "") == "launcher.common.records":
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return [found[name] for name in sorted(found)]


RECORDS = _launcher_records()


def _twin(cls: type) -> type:
    """``cls`` as ``@dataclass`` would have made it (same fields, same options, same qualname)."""
    fields = [(f.name, f.type, dataclasses.field(repr=f.repr, compare=f.compare, hash=f.hash))
              for f in dataclasses.fields(cls)]
    twin = dataclasses.make_dataclass(cls.__name__, fields, frozen=cls.__dataclass_params__.frozen)
    twin.__qualname__ = cls.__qualname__
    return twin


def _filled(cls: type, values: Tuple[Any, ...]) -> Any:
    obj = object.__new__(cls)
    for field, value in zip(dataclasses.fields(cls), values):
        object.__setattr__(obj, field.name, value)
    return obj


def test_the_launcher_has_records():
    names = {cls.__qualname__ for cls in RECORDS}
    assert {"RunOptions", "RunSpec", "RestartPolicy", "RankExited", "EnvContext", "WorkerSpec"} <= names


@pytest.mark.parametrize("cls", RECORDS, ids=lambda cls: f"{cls.__module__}.{cls.__qualname__}")
def test_every_launcher_record_shows_compares_and_hashes_as_its_dataclass_twin(cls):
    twin = _twin(cls)
    first = tuple(range(len(dataclasses.fields(cls))))
    variants = [first] + [first[:i] + (f"{i}",) + first[i + 1:] for i in range(len(first))]  # each field apart
    ours, theirs = [_filled(cls, v) for v in variants], [_filled(twin, v) for v in variants]
    assert [repr(x) for x in ours] == [repr(x) for x in theirs]
    assert [ours[0] == x for x in ours] == [theirs[0] == x for x in theirs]
    assert (cls.__hash__ is None) == (twin.__hash__ is None)
    if cls.__hash__ is not None:
        assert [hash(x) for x in ours] == [hash(x) for x in theirs]


@pytest.mark.parametrize("own_hash", [None, lambda self: 7])
def test_a_class_that_sets_its_own_hash_keeps_it(own_hash):
    def make(decorate):
        class Keyed:
            value: int = 0
            __hash__ = own_hash

        return decorate(Keyed)

    for cls in (make(dataclasses.dataclass(frozen=True)), make(record(frozen=True))):
        assert cls.__hash__ is own_hash
