"""``@record`` against ``@dataclass``: the same text, equality, hash, arguments and guards, on the same
classes."""

import dataclasses
import importlib
import inspect
import math
import pkgutil
from typing import Any, List, Optional, Tuple

import pytest
from hypothesis import given, settings, strategies as st

import launcher
from launcher.common.records import COMPILE_AFTER, init_fn, record


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


def _full_twin(cls: type) -> type:
    """``cls`` as ``@dataclass`` would have made it, ``__init__`` included: every field's default,
    factory, ``init`` and keyword-only flag, and ``__post_init__`` when it has one."""
    def spec(f: dataclasses.Field) -> dataclasses.Field:
        extra = {"kw_only": f.kw_only} if hasattr(f, "kw_only") else {}
        return dataclasses.field(default=f.default, default_factory=f.default_factory, init=f.init, repr=f.repr,
                                 compare=f.compare, hash=f.hash, **extra)

    namespace = {"__post_init__": cls.__post_init__} if hasattr(cls, "__post_init__") else {}
    twin = dataclasses.make_dataclass(cls.__name__, [(f.name, f.type, spec(f)) for f in dataclasses.fields(cls)],
                                      namespace=namespace, frozen=cls.__dataclass_params__.frozen)
    twin.__qualname__ = cls.__qualname__
    return twin


@pytest.mark.parametrize("cls", RECORDS, ids=lambda cls: f"{cls.__module__}.{cls.__qualname__}")
def test_every_launcher_record_takes_the_arguments_of_its_dataclass_twin(cls):
    ours = init_fn(cls, cls.__dataclass_params__.frozen)
    assert str(inspect.signature(ours)) == str(inspect.signature(_full_twin(cls).__init__))  # <factory>: ours
    assert ours.__qualname__ == f"{cls.__qualname__}.__init__"


def featured_classes(frozen: bool):
    """Every kind of field ``__init__`` treats apart, as a dataclass and as a record."""

    def make(decorate):
        class Featured:
            x: Any
            y: Any = 0
            items: List[Any] = dataclasses.field(default_factory=list)
            made: List[Any] = dataclasses.field(default_factory=lambda: ["made"], init=False)
            fixed: Any = dataclasses.field(default="fixed", init=False)
            unset: Any = dataclasses.field(init=False)
            keyword: Any = dataclasses.field(default=None, kw_only=True)

            def __post_init__(self) -> None:
                object.__setattr__(self, "post", (self.x, len(self.items)))

        return decorate(Featured)

    return make(dataclasses.dataclass(frozen=frozen)), make(record(frozen=frozen))


def _outcome(cls: type, args: Tuple[Any, ...], kwargs: dict) -> Any:
    try:
        obj = cls(*args, **kwargs)
    except TypeError as exc:
        return type(exc), str(exc)
    return vars(obj), obj.fixed, hasattr(obj, "unset")


ARGUMENT_VALUES = st.one_of(st.none(), st.integers(-2, 2), st.lists(st.integers(0, 3), max_size=2))


@settings(max_examples=200, deadline=None, database=None)
@given(st.booleans(), st.lists(ARGUMENT_VALUES, max_size=4),
       st.dictionaries(st.sampled_from(["x", "y", "items", "made", "keyword", "other"]), ARGUMENT_VALUES,
                       max_size=3))
def test_a_record_is_made_from_the_same_arguments_as_the_dataclass(frozen, args, kwargs):
    theirs, ours = featured_classes(frozen)
    for _ in range(COMPILE_AFTER + 2):  # by the stand-in, then by the compiled __init__
        assert _outcome(ours, tuple(args), kwargs) == _outcome(theirs, tuple(args), kwargs)
    ours_again = featured_classes(frozen)[1]
    assert ours_again(1).items is not ours_again(1).items  # the factory runs for each instance


def test_the_init_is_compiled_once_the_class_is_made_often():
    cls = featured_classes(True)[1]
    standin = cls.__init__
    assert "*args" in str(inspect.signature(standin))
    for _ in range(COMPILE_AFTER):
        cls(1)
    assert cls.__init__ is standin
    cls(1)
    assert cls.__init__ is not standin
    assert str(inspect.signature(cls)) == str(inspect.signature(featured_classes(True)[0]))


def test_arguments_the_stand_in_cannot_bind_get_the_dataclass_error():
    theirs = featured_classes(False)[0]
    for args, kwargs in (((), {}), ((1, 2, 3, 4), {}), ((1,), {"x": 2}), ((1,), {"made": 2})):
        with pytest.raises(TypeError) as expected:
            theirs(*args, **kwargs)
        with pytest.raises(TypeError) as got:
            featured_classes(False)[1](*args, **kwargs)
        assert str(got.value) == str(expected.value)


@pytest.mark.parametrize("frozen", [True, False])
def test_a_record_guards_its_fields_as_the_dataclass_does(frozen):
    outcomes = []
    for cls in featured_classes(frozen):
        obj, child = cls(1), type("Child", (cls,), {})(1)
        seen = []
        for target, name in ((obj, "x"), (obj, "other"), (child, "x"), (child, "other")):
            for act in (lambda: setattr(target, name, 2), lambda: delattr(target, name)):
                try:
                    act()
                    seen.append("ok")
                except (dataclasses.FrozenInstanceError, AttributeError) as exc:
                    seen.append(f"{type(exc).__name__}: {exc}")
        outcomes.append(seen)
    assert outcomes[0] == outcomes[1]
    assert ("FrozenInstanceError: cannot assign to field 'x'" in outcomes[1]) == frozen


def test_what_dataclasses_refuses_a_record_refuses():
    class Ordered:
        a: int = 0
        b: int

    class Guarded:
        a: int

        def __setattr__(self, name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

    class Late:
        a: int
        late: dataclasses.InitVar[int] = 0

    for cls, frozen, message in ((Ordered, False, "non-default argument 'b' follows default argument"),
                                 (Guarded, True, "Cannot overwrite attribute __setattr__"),
                                 (Late, False, "takes no InitVar")):
        with pytest.raises(TypeError, match=message):
            record(cls, frozen=frozen)


def test_a_record_on_a_dataclass_base_is_made_by_dataclasses():
    @dataclasses.dataclass(frozen=True)
    class Base:
        a: int

    @record(frozen=True)
    class Derived(Base):
        b: int = 1

    assert Derived(2) == Derived(2, 1) and repr(Derived(2)) == "test_a_record_on_a_dataclass_base_is_made_by_dataclasses.<locals>.Derived(a=2, b=1)"
    with pytest.raises(TypeError, match="non-frozen"):
        record(type("Mutable", (Base,), {"__annotations__": {"c": int}}))
