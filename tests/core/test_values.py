"""`@immutable` behaves as `@dataclass(frozen=True, slots=True)` does, for every class it makes.

Two kinds of check: classes made here twice from one body, once by each decorator, and
compared call by call (construction, defaults, `__post_init__`, repr, eq, hash, order,
frozen errors, `replace`, `asdict`, pickle, copy, `match`); and every `@immutable` class of
the package, compared with the standard library's class made from the same fields and
methods (signature, fields, slots, match args, parameters, and the behaviour of instances
holding distinct values).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
import json
import math
import pickle
import pkgutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import FrozenInstanceError, dataclass, field
from typing import Any

import pytest

import wedgewatch
from wedgewatch.core import values
from wedgewatch.core.values import immutable

#: What the standard library makes for a frozen, slotted dataclass: kept apart from the
#: class's own methods when a twin is built from an `@immutable` class.
GENERATED = {
    "__init__", "__repr__", "__eq__", "__hash__", "__setattr__", "__delattr__",
    "__getstate__", "__setstate__", "__lt__", "__le__", "__gt__", "__ge__",
    "__dataclass_fields__", "__dataclass_params__", "__match_args__", "__slots__",
    "__dict__", "__weakref__",
}  # fmt: skip


def made_by_immutable(cls: type) -> bool:
    """Whether `cls` was made by `@immutable` (its `__setattr__` is the module's)."""
    method = cls.__dict__.get("__setattr__")
    code = getattr(method, "__code__", None)
    return code is not None and code.co_filename == values.__file__


def twins(name: str, body: dict[str, Any], order: bool = False) -> tuple[type, type]:
    """The class `name` with `body` made by `@immutable` and by the standard library; both
    are published in this module under their names (`name`, `Std` + name) so they pickle."""
    made = []
    for qualname, decorate in (
        (name, immutable(order=True) if order else immutable),
        ("Std" + name, dataclass(frozen=True, slots=True, order=order)),
    ):
        namespace = {**body, "__module__": __name__, "__qualname__": qualname}
        cls = decorate(type(qualname, (), namespace))
        globals()[qualname] = cls
        made.append(cls)
    return made[0], made[1]


def _post_init(self: Any) -> None:
    if self.count < 0:
        raise ValueError(f"count must be >= 0, got {self.count}")


BODIES: dict[str, tuple[dict[str, Any], bool]] = {
    "Plain": (
        {
            "__doc__": "Fields with and without defaults.",
            "__annotations__": {"name": "str", "count": "int", "tags": "tuple[str, ...]"},
            "count": 0,
            "tags": field(default_factory=tuple),
        },
        False,
    ),
    "Checked": (
        {
            "__doc__": "A `__post_init__` that rejects values.",
            "__annotations__": {"count": "int", "seen": "list[int]"},
            "seen": field(default_factory=list, metadata={"unit": "items"}),
            "__post_init__": _post_init,
            "double": property(lambda self: 2 * self.count),
        },
        False,
    ),
    "Single": ({"__doc__": "One field.", "__annotations__": {"x": "float"}}, False),
    "Empty": ({"__doc__": "No field at all.", "__annotations__": {}}, False),
    "Undocumented": ({"__annotations__": {"x": "int", "y": "int | None"}, "y": None}, False),
    "Ordered": (
        {"__doc__": "order=True.", "__annotations__": {"a": "str", "b": "int"}, "b": 0},
        True,
    ),
    "OwnEq": (
        {
            "__doc__": "Its own __eq__ (the generated hash stays, as the standard one's).",
            "__annotations__": {"x": "int", "y": "int"},
            "__eq__": lambda self, other: isinstance(other, type(self)) and self.x == other.x,
        },
        False,
    ),
    "OwnHashRepr": (
        {
            "__doc__": "Its own __hash__ and __repr__.",
            "__annotations__": {"x": "int"},
            "__hash__": lambda self: 7,
            "__repr__": lambda self: f"<{self.x}>",
        },
        False,
    ),
}

#: Arguments to construct each body's classes with: positional and keyword.
ARGUMENTS: dict[str, list[tuple[tuple[Any, ...], dict[str, Any]]]] = {
    "Plain": [(("a",), {}), (("a", 2), {}), ((), {"name": "b", "tags": ("t",)})],
    "Checked": [((1,), {}), ((), {"count": 2, "seen": [1]})],
    "Single": [((1.5,), {}), ((math.nan,), {})],
    "Empty": [((), {})],
    "Undocumented": [((1,), {}), ((1, 2), {})],
    "Ordered": [(("a",), {}), (("a", 1), {}), (("b", 0), {})],
    "OwnEq": [((1, 2), {}), ((1, 3), {})],
    "OwnHashRepr": [((1,), {})],
}

PAIRS = {name: twins(name, body, order) for name, (body, order) in BODIES.items()}


def same_repr(ours: object, theirs: object) -> None:
    assert repr(ours) == repr(theirs).replace("Std", "", 1)


def shape(cls: type) -> dict[str, Any]:
    """What code can read off a dataclass without making one."""
    params = cls.__dataclass_params__  # type: ignore[attr-defined]
    return {
        "signature": str(inspect.signature(cls)),
        "init annotations": cls.__init__.__annotations__,  # type: ignore[misc]
        "fields": [
            (f.name, f.type, f.default, f.default_factory, f.init, f.repr, f.hash, f.compare,
             f.kw_only, dict(f.metadata))
            for f in dataclasses.fields(cls)
        ],
        "params": repr(params),
        "match_args": cls.__match_args__,  # type: ignore[attr-defined]
        "slots": cls.__slots__,  # type: ignore[attr-defined]
        "doc": (cls.__doc__ or "").replace("Std", "", 1),
        "hashable": cls.__hash__ is not None,  # type: ignore[comparison-overlap]
        "methods": sorted(k for k in vars(cls) if k not in ("__qualname__", "__doc__")),
    }  # fmt: skip


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_a_class_reads_as_the_standard_librarys(name: str) -> None:
    """Signature, fields, parameters, match args, slots, doc and methods are the same."""
    ours, theirs = PAIRS[name]
    assert made_by_immutable(ours)
    assert not made_by_immutable(theirs)
    assert dataclasses.is_dataclass(ours)
    assert shape(ours) == shape(theirs)


def _calls(instance: Any, other: Any) -> dict[str, Callable[[], object]]:
    """Operations whose result or exception must be the same for both decorators."""
    first = dataclasses.fields(instance)[0].name if dataclasses.fields(instance) else None
    calls: dict[str, Callable[[], object]] = {
        "eq self": lambda: instance == copy.copy(instance),
        "eq other": lambda: instance == other,
        "ne other": lambda: instance != other,
        "eq foreign": lambda: instance == object(),
        "hash": lambda: hash(instance) == hash(copy.copy(instance)),
        "asdict": lambda: dataclasses.asdict(instance),
        "astuple": lambda: dataclasses.astuple(instance),
        "set other": lambda: setattr(instance, "not_a_field", 1),
        "del other": lambda: delattr(instance, "not_a_field"),
        "vars": lambda: vars(instance),
        "replace none": lambda: dataclasses.replace(instance) == instance,
        "pickle": lambda: pickle.loads(pickle.dumps(instance)) == instance,  # noqa: S301
        "deepcopy": lambda: copy.deepcopy(instance) == instance,
        "lt": lambda: instance < other,
        "le": lambda: instance <= other,
        "gt": lambda: instance > other,
        "ge": lambda: instance >= other,
        "lt foreign": lambda: instance < 1,
    }
    if first is not None:
        calls["set field"] = lambda: setattr(instance, first, 1)
        calls["del field"] = lambda: delattr(instance, first)
        calls["replace"] = lambda: dataclasses.asdict(
            dataclasses.replace(instance, **{first: getattr(other, first)})
        )
    return calls


#: CPython 3.11's frozen, slotted dataclass fails to refuse a name that is not a field: its
#: `__setattr__` and `__delattr__` call `super()` with the class as it was before slots
#: replaced it, a TypeError. `@immutable` refuses it as the standard library means to.
SUPER_BUG = ("TypeError", "super(type, obj): obj must be an instance or subtype of type")
FIXED = {
    "set other": ("FrozenInstanceError", "cannot assign to field 'not_a_field'"),
    "del other": ("FrozenInstanceError", "cannot delete field 'not_a_field'"),
}


def same_or_fixed(what: str, theirs: tuple[str, str]) -> tuple[str, str]:
    """The standard library's outcome, or the intended one where 3.11's is the super() bug."""
    return FIXED[what] if what in FIXED and theirs == SUPER_BUG else theirs


def outcome(call: Callable[[], object]) -> tuple[str, str]:
    """A call's result, or its exception's type and message, as text (class names unified)."""
    try:
        result = repr(call())
    except Exception as error:  # the exception is the outcome compared
        return type(error).__name__, str(error).replace("Std", "")
    return "returned", result.replace("Std", "")


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_instances_behave_as_the_standard_librarys(name: str) -> None:
    """Construction, repr, eq, hash, order, frozen errors, replace, pickle and copy agree."""
    ours, theirs = PAIRS[name]
    made = [(ours(*args, **kwargs), theirs(*args, **kwargs)) for args, kwargs in ARGUMENTS[name]]
    for (mine, std), (other, std_other) in zip(made, [*made[1:], made[0]], strict=True):
        same_repr(mine, std)
        assert outcome(lambda: hash(mine)) == outcome(lambda: hash(std))  # noqa: B023
        calls, std_calls = _calls(mine, other), _calls(std, std_other)
        assert calls.keys() == std_calls.keys()
        for what in calls:
            assert outcome(calls[what]) == same_or_fixed(what, outcome(std_calls[what])), what


@pytest.mark.parametrize(
    ("name", "args", "kwargs"),
    [
        ("Plain", (), {}),
        ("Plain", ("a", 1, (), 4), {}),
        ("Plain", ("a",), {"name": "b"}),
        ("Plain", ("a",), {"colour": "b"}),
        ("Checked", (-1,), {}),
        ("Single", (), {}),
        ("Empty", (1,), {}),
    ],
)
def test_bad_arguments_fail_as_the_standard_librarys(
    name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """A missing, extra, repeated or unknown argument, or a `__post_init__` refusal."""
    ours, theirs = PAIRS[name]
    assert outcome(lambda: ours(*args, **kwargs)) == outcome(lambda: theirs(*args, **kwargs))
    assert outcome(lambda: ours(*args, **kwargs))[0] in {"TypeError", "ValueError"}


def test_defaults_are_fresh_and_factories_run_per_instance() -> None:
    """A default factory runs for each instance; an explicit argument is kept as given."""
    checked = PAIRS["Checked"][0]
    one, two = checked(1), checked(1)
    assert one.seen == []
    assert one.seen is not two.seen
    given = [5]
    assert checked(1, given).seen is given


def test_a_nan_field_equals_itself_as_in_a_tuple() -> None:
    """Equality compares field tuples, so the same NaN object is equal to itself."""
    for cls in PAIRS["Single"]:
        nan = math.nan
        assert cls(nan) == cls(nan)
        assert cls(float("nan")) != cls(float("nan"))


def test_match_binds_positional_fields() -> None:
    """`__match_args__` lets `match` bind the fields in order."""
    plain = PAIRS["Plain"][0]
    match plain("a", 3):
        case plain(name, count):  # type: ignore[misc]
            assert (name, count) == ("a", 3)
        case _:
            pytest.fail("no match")


def test_a_plain_subclass_may_add_attributes_but_not_change_fields() -> None:
    """A subclass's instances are frozen in their fields only, as the standard library
    means (3.11's fails on the other names with the super() TypeError, see SUPER_BUG)."""
    ours, theirs = PAIRS["Plain"]
    added = {}
    for cls in (ours, theirs):
        instance = type("Sub", (cls,), {})("a")
        with pytest.raises(FrozenInstanceError, match="cannot assign to field 'name'"):
            instance.name = "b"
        assert instance != cls("a")
        added[cls] = outcome(lambda: setattr(instance, "extra", 1))  # noqa: B023
        assert getattr(instance, "extra", None) == (1 if added[cls][0] == "returned" else None)
    assert added[ours] == ("returned", "None")
    assert added[theirs] in {("returned", "None"), SUPER_BUG}


def test_repr_of_a_value_holding_itself_says_so() -> None:
    """A repr that reaches its own instance again prints `...` (no endless recursion)."""
    for cls in PAIRS["Checked"]:
        instance = cls(1)
        instance.seen.append(instance)
        assert repr(instance).endswith("seen=[...])")


def test_a_class_with_non_default_before_default_is_refused() -> None:
    """A field without a default after one with a default is a TypeError, as usual."""
    body = {"__annotations__": {"a": "int", "b": "int"}, "a": 1}
    with pytest.raises(TypeError, match="non-default argument 'b' follows default argument"):
        immutable(type("Bad", (), dict(body)))
    with pytest.raises(TypeError, match="non-default argument 'b' follows default argument"):
        dataclass(frozen=True, slots=True)(type("Bad", (), dict(body)))


@pytest.mark.parametrize(
    ("namespace", "bases", "why"),
    [
        ({"__annotations__": {"x": "ClassVar[int]"}}, (), "is a ClassVar or an InitVar"),
        ({"__annotations__": {"x": "InitVar[int]"}}, (), "is a ClassVar or an InitVar"),
        ({"__annotations__": {"x": "int"}, "x": field(default=0, repr=False)}, (), "sets repr"),
        ({"__annotations__": {"x": "int"}, "x": field(default=0, kw_only=True)}, (), "kw_only"),
        ({"__annotations__": {"x": "int"}, "x": field(default=0, init=False)}, (), "sets init"),
        ({"__annotations__": {"x": "int"}, "x": field(compare=False)}, (), "sets compare"),
        ({"__annotations__": {"x": "int"}, "x": field(hash=True)}, (), "sets hash"),
        ({"__annotations__": {"x": "int"}, "__lt__": lambda s, o: True}, (), "defines __lt__"),
        ({"__annotations__": {"x": "int"}, "__setattr__": setattr}, (), "defines __setattr__"),
        ({"__annotations__": {"x": "int"}, "__slots__": ("x",)}, (), "defines __slots__"),
        ({"__annotations__": {"x": "int"}}, (Exception,), "has a base class"),
    ],
)
def test_what_it_does_not_copy_is_refused_when_the_class_is_made(
    namespace: dict[str, Any], bases: tuple[type, ...], why: str
) -> None:
    """Anything the standard library would treat differently fails loudly at import."""
    with pytest.raises(TypeError, match=why):
        immutable(type("Refused", bases, dict(namespace)))


def _package_modules() -> list[str]:
    """Every module of the package but the lab (which keeps the standard library's)."""
    return [
        info.name
        for info in pkgutil.walk_packages(wedgewatch.__path__, "wedgewatch.")
        if not info.name.startswith("wedgewatch.lab") and info.name != "wedgewatch.__main__"
    ]


def _package_classes() -> list[type]:
    found: dict[str, type] = {}
    for name in _package_modules():
        module = importlib.import_module(name)
        for obj in vars(module).values():
            if isinstance(obj, type) and obj.__module__ == name and made_by_immutable(obj):
                found[f"{name}.{obj.__qualname__}"] = obj
    return [found[key] for key in sorted(found)]


PACKAGE_CLASSES = _package_classes()


def test_the_package_makes_its_value_types_with_immutable() -> None:
    """The check below covers the package's value types (more than a hundred)."""
    assert len(PACKAGE_CLASSES) > 100


def standard_twin(cls: type) -> type:
    """The standard library's frozen, slotted dataclass made from `cls`'s fields and methods."""
    namespace = {k: v for k, v in vars(cls).items() if k not in GENERATED}
    namespace.update({k: v for k in ("__repr__", "__eq__", "__hash__") if (v := _own(cls, k))})
    for f in dataclasses.fields(cls):
        if f.default_factory is not dataclasses.MISSING:
            namespace[f.name] = field(default_factory=f.default_factory, metadata=f.metadata)
        elif f.default is not dataclasses.MISSING:
            namespace[f.name] = field(default=f.default, metadata=f.metadata)
        elif f.metadata:
            namespace[f.name] = field(metadata=f.metadata)
    order = cls.__dataclass_params__.order  # type: ignore[attr-defined]
    return dataclass(frozen=True, slots=True, order=order)(type(cls.__name__, (), namespace))


def _own(cls: type, name: str) -> object:
    """The class's own method `name`, when it is not one `@immutable` generated."""
    method = vars(cls).get(name)
    code = getattr(method, "__code__", None)
    return None if code is None or code.co_filename == values.__file__ else method


def distinct(cls: type, seed: int) -> Any:
    """An instance whose every field holds a different hashable value, made without
    `__init__` (whose `__post_init__` may refuse such values), as unpickling makes one."""
    instance = cls.__new__(cls)
    state = [(seed, i, f.name) for i, f in enumerate(dataclasses.fields(cls))]
    instance.__setstate__(state)
    return instance


@pytest.mark.parametrize("cls", PACKAGE_CLASSES, ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_every_package_value_type_matches_the_standard_library(cls: type) -> None:
    """Same shape as the standard library's class from the same body, and the same answers
    for instances holding the same distinct values."""
    twin = standard_twin(cls)
    ours, theirs = shape(cls), shape(twin)
    assert ours == theirs
    for seed in (1, 2):
        mine, std = distinct(cls, seed), distinct(twin, seed)
        assert repr(mine) == repr(std)
        assert hash(mine) == hash(std)
        calls, std_calls = _calls(mine, distinct(cls, 3)), _calls(std, distinct(twin, 3))
        for what in calls.keys() & {"eq self", "eq other", "ne other", "set field", "set other",
                                    "del field", "asdict", "lt", "ge", "lt foreign"}:  # fmt: skip
            assert outcome(calls[what]) == same_or_fixed(what, outcome(std_calls[what])), what
        assert pickle.loads(pickle.dumps(mine)) == mine  # noqa: S301 - our own bytes


#: The exec probe's imports (`entry.fast_check`), listing every frozen dataclass they made
#: and whether `@immutable` made it.
PROBE_CLASSES = """
import dataclasses, json, sys
from wedgewatch import check
from wedgewatch.check import settings
from wedgewatch.core import values
made = {}
for name, module in list(sys.modules.items()):
    if not name.startswith("wedgewatch"):
        continue
    for obj in vars(module).values():
        if isinstance(obj, type) and obj.__module__ == name and dataclasses.is_dataclass(obj):
            if obj.__dataclass_params__.frozen:
                code = getattr(obj.__dict__.get("__setattr__"), "__code__", None)
                made[f"{name}.{obj.__qualname__}"] = (
                    code is not None and code.co_filename == values.__file__
                )
print(json.dumps(made))
"""


def test_every_frozen_dataclass_the_exec_probe_imports_is_made_by_immutable() -> None:
    """The probe's start-up pays for no standard-library frozen dataclass (0.3 ms each)."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE_CLASSES], capture_output=True, text=True, check=True
    )
    made = json.loads(done.stdout)
    assert len(made) > 40
    # The one standard-library class: the one `@immutable` reads the standard shape from.
    assert sorted(name for name, ours in made.items() if not ours) == [
        "wedgewatch.core.values._Shape"
    ]


def test_init_is_the_classs_own_however_it_is_first_reached() -> None:
    """`__init__`, compiled on first use, is the same whether a subclass, `inspect`, or
    the class itself reaches it first."""
    body = {"__doc__": "Lazy.", "__annotations__": {"x": "int"}, "x": 0}
    through_sub, through_signature, direct = (
        immutable(type(name, (), dict(body))) for name in ("Sub", "Sig", "Direct")
    )
    sub = type("Child", (through_sub,), {})
    assert (sub(3).x, sub().x, through_sub(4).x) == (3, 0, 4)
    assert str(inspect.signature(through_signature)) == "(x: 'int' = 0) -> None"
    assert through_signature(5).x == 5
    assert direct(6).x == 6
    for cls in (through_sub, through_signature, direct):
        assert cls.__init__.__qualname__ == f"{cls.__qualname__}.__init__"  # type: ignore[misc]
        assert isinstance(vars(cls)["__init__"], type(lambda: None))


@pytest.mark.parametrize(
    "namespace",
    [
        {"__annotations__": {"x": "list[int]"}, "x": []},
        {"__annotations__": {"x": "int"}, "y": field(default=0)},
    ],
    ids=["mutable default", "field without annotation"],
)
def test_a_bad_field_fails_as_the_standard_librarys(namespace: dict[str, Any]) -> None:
    """A mutable default or an unannotated `field()`: the same error as the standard one."""
    ours = outcome(lambda: immutable(type("Bad", (), dict(namespace))))
    theirs = outcome(lambda: dataclass(frozen=True, slots=True)(type("Bad", (), dict(namespace))))
    assert ours == theirs
    assert ours[0] in {"TypeError", "ValueError"}


def test_a_class_with_a_metaclass_is_refused() -> None:
    """A metaclass could see the class made twice (the slots): refused, as other bases."""
    with pytest.raises(TypeError, match="it has a metaclass"):
        immutable(type("Meta", (type,), {})("Refused", (), {"__annotations__": {"x": "int"}}))
