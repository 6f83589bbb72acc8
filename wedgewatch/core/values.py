"""`@immutable`: the project's value types, a cheaper `@dataclass(frozen=True, slots=True)`.

An `@immutable` class is a standard-library dataclass in every way code can observe: the same
`__init__` signature (defaults, `field(default=...)`, `field(default_factory=...)`,
`__post_init__`), `__repr__` text, `__eq__` and `__hash__` over the fields, `order=True`
comparisons, `FrozenInstanceError` on assignment and deletion, `__slots__`,
`__match_args__`, pickling, and `dataclasses.fields`, `replace`, `asdict` and
`is_dataclass`. tests/core/test_values.py checks every `@immutable` class of the package
against the standard library's decorator. One difference, a fix: assigning or deleting a
name that is not a field raises `FrozenInstanceError`, where CPython 3.11's frozen slotted
dataclass fails with a `TypeError` from `super()` (its method names the class as it was
before the slots replaced it).

Why it exists: on CPython 3.11 the standard decorator compiles every generated method of a
class with its own `exec` (`__init__`, `__repr__`, `__eq__`, `__hash__`, and for a frozen
class `__setattr__` and `__delattr__`), about 0.3 ms a class. The exec probe imports some
fifty value types to answer once and exit: about 15 ms of CPU. Here the fields are
collected as the standard library collects them (its `Field` objects, marked as it marks
them: the marks are read off one class it made, `_Shape`), the class is made again with
slots, and `__init__`, `__repr__`, `__eq__` and `__hash__` are compiled, each when first
used (`__init__` stores through the slots' descriptors, faster than the standard one); the
other methods are closures over the field names.

What it does not support (a class with a base class or a metaclass, `ClassVar` or
`InitVar` annotations, a field option other than a default, a default factory or
metadata, a class defining `__setattr__`, `__delattr__`, `__slots__` or an ordering
method) is a `TypeError` when the class is defined: use
`dataclasses.dataclass(frozen=True, slots=True)` for it.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
from _thread import get_ident
from collections.abc import Callable
from dataclasses import MISSING, Field, FrozenInstanceError
from operator import attrgetter
from typing import TYPE_CHECKING, Any, TypeVar, cast, overload

__all__ = ["immutable"]

_T = TypeVar("_T")

#: The default of an `__init__` parameter whose field has a default factory (it shows as
#: `<factory>` in the signature, as the standard library's does).
_HAS_DEFAULT_FACTORY: Any = type("_HasDefaultFactory", (), {"__repr__": lambda _: "<factory>"})()

#: The only `field()` options a value type may set; any other must keep its default.
_FIELD_DEFAULTS = {"init": True, "repr": True, "hash": None, "compare": True, "kw_only": MISSING}

_ORDER = ("__lt__", "__le__", "__gt__", "__ge__")


def _unsupported(cls: type, why: str) -> TypeError:
    return TypeError(
        f"@immutable cannot make {cls.__qualname__}: {why}; "
        "use dataclasses.dataclass(frozen=True, slots=True) for it"
    )


def _check_supported(cls: type) -> None:
    """Raise TypeError for a class whose standard-library dataclass this module cannot copy."""
    if cls.__bases__ != (object,):
        raise _unsupported(cls, "it has a base class")
    if type(cls) is not type:
        raise _unsupported(cls, "it has a metaclass")
    body = cls.__dict__
    for name in ("__slots__", "__setattr__", "__delattr__", *_ORDER):
        if name in body:
            raise _unsupported(cls, f"it defines {name}")
    for name, annotation in body.get("__annotations__", {}).items():
        text = annotation if isinstance(annotation, str) else repr(annotation)
        if "ClassVar" in text or "InitVar" in text:
            raise _unsupported(cls, f"{name} is a ClassVar or an InitVar")
        default = body.get(name)
        if isinstance(default, Field):
            for option, usual in _FIELD_DEFAULTS.items():
                if getattr(default, option) is not usual:
                    raise _unsupported(cls, f"field {name} sets {option}")


def _getter(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """A function of an instance returning the tuple of these fields' values."""
    if len(names) > 1:
        return attrgetter(*names)
    if names:
        one = attrgetter(names[0])
        return lambda self: (one(self),)
    return lambda _self: ()


def _compile(
    cls: type, name: str, params: list[str], lines: list[str], scope: dict[str, Any]
) -> Any:
    """The method `name` of `cls`, from its parameters and body (one `exec`)."""
    source = (
        f"def __create_fn__({', '.join(scope)}):\n"
        f" def {name}({', '.join(params)}):\n"
        + "".join(f"  {line}\n" for line in lines or ["pass"])
        + f" return {name}\n"
    )
    module = sys.modules.get(cls.__module__)
    namespace: dict[str, Any] = {}
    exec(source, module.__dict__ if module else {}, namespace)  # noqa: S102 - the method's text is made here from field names
    method = namespace["__create_fn__"](**scope)
    method.__qualname__ = f"{cls.__qualname__}.{name}"
    return method


def _init(cls: type, fields: tuple[Field[Any], ...]) -> Callable[..., None]:
    """`__init__`: it stores each argument through its slot's descriptor."""
    scope: dict[str, Any] = {"_HAS_DEFAULT_FACTORY": _HAS_DEFAULT_FACTORY}
    params = ["self"]
    lines = []
    defaulted = None
    for f in fields:
        if f.default is not MISSING or f.default_factory is not MISSING:
            defaulted = f.name
        elif defaulted is not None:
            raise TypeError(f"non-default argument {f.name!r} follows default argument")
        scope[f"_set_{f.name}"] = cls.__dict__[f.name].__set__
        if f.default_factory is not MISSING:
            scope[f"_dflt_{f.name}"] = f.default_factory
            params.append(f"{f.name}=_HAS_DEFAULT_FACTORY")
            lines.append(
                f"_set_{f.name}(self, _dflt_{f.name}() "
                f"if {f.name} is _HAS_DEFAULT_FACTORY else {f.name})"
            )
        else:
            if f.default is not MISSING:
                scope[f"_dflt_{f.name}"] = f.default
                params.append(f"{f.name}=_dflt_{f.name}")
            else:
                params.append(f.name)
            lines.append(f"_set_{f.name}(self, {f.name})")
    if hasattr(cls, "__post_init__"):
        lines.append("self.__post_init__()")
    init: Callable[..., None] = _compile(cls, "__init__", params, lines, scope)
    init.__annotations__ = {f.name: f.type for f in fields} | {"return": None}
    return init


def _as_tuple(owner: str, fields: tuple[Field[Any], ...]) -> str:
    return "(" + "".join(f"{owner}.{f.name}," for f in fields) + ")"


def _eq(cls: type, fields: tuple[Field[Any], ...]) -> Callable[[Any, Any], Any]:
    """`__eq__`: the tuples of field values, for two instances of one class."""
    lines = [
        "if other.__class__ is self.__class__:",
        f" return {_as_tuple('self', fields)}=={_as_tuple('other', fields)}",
        "return NotImplemented",
    ]
    eq: Callable[[Any, Any], Any] = _compile(cls, "__eq__", ["self", "other"], lines, {})
    return eq


def _hash(cls: type, fields: tuple[Field[Any], ...]) -> Callable[[Any], int]:
    """`__hash__`: the hash of the tuple of field values."""
    lines = [f"return hash({_as_tuple('self', fields)})"]
    hash_: Callable[[Any], int] = _compile(cls, "__hash__", ["self"], lines, {})
    return hash_


def _repr(cls: type, fields: tuple[Field[Any], ...]) -> Callable[[Any], str]:
    """`__repr__`: `Name(a=1, b='x')`, and `...` for an instance already being shown (a
    value that holds itself), as the standard library's."""
    shown = ", ".join(f"{f.name}={{self.{f.name}!r}}" for f in fields)
    lines = [
        "key = id(self), _get_ident()",
        "if key in _running:",
        " return '...'",
        "_running.add(key)",
        "try:",
        f" return f'{{self.__class__.__qualname__}}({shown})'",
        "finally:",
        " _running.discard(key)",
    ]
    scope = {"_get_ident": get_ident, "_running": set()}
    repr_: Callable[[Any], str] = _compile(cls, "__repr__", ["self"], lines, scope)
    return repr_


#: The methods compiled when first used, and how.
_COMPILED: dict[str, Callable[[type, tuple[Field[Any], ...]], Any]] = {
    "__init__": _init,
    "__repr__": _repr,
    "__eq__": _eq,
    "__hash__": _hash,
}


class _OnFirstUse:
    """A compiled method of a class (`_COMPILED`) until something first reads it (to
    construct, compare or hash an instance, `inspect.signature`, `cls.__init__`): then it
    is compiled and put in its place. A process that defines fifty value types and makes
    twenty compiles twenty `__init__`s."""

    __slots__ = ("cls", "fields", "name")

    def __init__(self, cls: type, name: str, fields: tuple[Field[Any], ...]) -> None:
        self.cls = cls
        self.name = name
        self.fields = fields

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        method = _COMPILED[self.name](self.cls, self.fields)
        type.__setattr__(self.cls, self.name, method)
        return method if instance is None else method.__get__(instance, owner)


def _methods(cls: type, fields: tuple[Field[Any], ...], order: bool) -> dict[str, Any]:
    """The methods the standard library generates for a frozen class, but `__init__`."""
    names = tuple(f.name for f in fields)
    values = _getter(names)
    owner: Any = cls

    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is cls or name in names:
            raise FrozenInstanceError(f"cannot assign to field {name!r}")
        super(owner, self).__setattr__(name, value)

    def __delattr__(self: Any, name: str) -> None:
        if type(self) is cls or name in names:
            raise FrozenInstanceError(f"cannot delete field {name!r}")
        super(owner, self).__delattr__(name)

    def __getstate__(self: Any) -> list[Any]:
        return list(values(self))

    def __setstate__(self: Any, state: list[Any]) -> None:
        for name, value in zip(names, state, strict=False):
            object.__setattr__(self, name, value)

    methods: dict[str, Any] = {
        "__setattr__": __setattr__,
        "__delattr__": __delattr__,
        "__getstate__": __getstate__,
        "__setstate__": __setstate__,
    }
    if order:
        methods.update(_ordering(values))
    return methods


def _ordering(values: Callable[[Any], tuple[Any, ...]]) -> dict[str, Any]:
    """`order=True`: compare the tuples of field values of two instances of one class."""

    def __lt__(self: Any, other: Any) -> Any:
        if other.__class__ is self.__class__:
            return values(self) < values(other)
        return NotImplemented

    def __le__(self: Any, other: Any) -> Any:
        if other.__class__ is self.__class__:
            return values(self) <= values(other)
        return NotImplemented

    def __gt__(self: Any, other: Any) -> Any:
        if other.__class__ is self.__class__:
            return values(self) > values(other)
        return NotImplemented

    def __ge__(self: Any, other: Any) -> Any:
        if other.__class__ is self.__class__:
            return values(self) >= values(other)
        return NotImplemented

    return {"__lt__": __lt__, "__le__": __le__, "__gt__": __gt__, "__ge__": __ge__}


@dataclasses.dataclass(frozen=True, slots=True)
class _Shape:
    """What the standard library writes into a frozen, slotted dataclass, read off one."""

    field: int


_FIELD_KIND = _Shape.__dataclass_fields__["field"]._field_type  # type: ignore[attr-defined]
_PARAMS = {False: _Shape.__dataclass_params__, True: copy.copy(_Shape.__dataclass_params__)}  # type: ignore[attr-defined]
_PARAMS[True].order = True


def _fields(cls: type) -> dict[str, Field[Any]]:
    """The class's fields, as the standard library's `_process_class` makes them."""
    body = cls.__dict__
    annotations = body.get("__annotations__", {})
    fields: dict[str, Field[Any]] = {}
    for name, annotation in annotations.items():
        default = body.get(name, MISSING)
        made: Any = default if isinstance(default, Field) else dataclasses.field(default=default)
        made.name = name
        made.type = annotation
        made._field_type = _FIELD_KIND
        made.kw_only = False
        if made.default is not MISSING and made.default.__class__.__hash__ is None:
            raise ValueError(
                f"mutable default {type(made.default)} for field {name} is not allowed: "
                "use default_factory"
            )
        fields[name] = made
    for name, value in body.items():
        if isinstance(value, Field) and name not in annotations:
            raise TypeError(f"{name!r} is a field but has no type annotation")
    return fields


def _make(cls: type[_T], order: bool) -> type[_T]:
    _check_supported(cls)
    body = dict(cls.__dict__)
    fields_by_name = _fields(cls)
    names = tuple(fields_by_name)
    # The class again, with slots for the fields (what the standard library does for
    # `slots=True`), and the attributes `dataclasses.fields`, `replace` and `asdict` read.
    namespace = {k: v for k, v in body.items() if k not in fields_by_name}
    namespace.pop("__dict__", None)
    namespace.pop("__weakref__", None)
    namespace["__slots__"] = names
    namespace["__dataclass_fields__"] = fields_by_name
    namespace["__dataclass_params__"] = _PARAMS[order]
    namespace.setdefault("__match_args__", names)
    made: Any = type(cls.__name__, cls.__bases__, namespace)
    made.__qualname__ = cls.__qualname__
    fields = tuple(fields_by_name.values())
    methods: dict[str, Any] = _methods(made, fields, order)
    methods.update({name: _OnFirstUse(made, name, fields) for name in _COMPILED})
    explicit_hash = body.get("__hash__", MISSING)
    if not (explicit_hash is MISSING or (explicit_hash is None and "__eq__" in body)):
        del methods["__hash__"]  # the class's own, as the standard library keeps it
    for name, method in methods.items():
        if name in body and name != "__hash__":
            continue
        if not isinstance(method, _OnFirstUse):
            method.__qualname__ = f"{made.__qualname__}.{name}"
        setattr(made, name, method)
    if not body.get("__doc__"):
        import inspect  # noqa: PLC0415 - as the standard library does, for a class without one

        made.__doc__ = made.__name__ + str(inspect.signature(made)).replace(" -> None", "")
    return cast("type[_T]", made)


if TYPE_CHECKING:
    from typing import dataclass_transform

    @overload
    def immutable(cls: type[_T], /) -> type[_T]: ...

    @overload
    def immutable(*, order: bool = False) -> Callable[[type[_T]], type[_T]]: ...

    @dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field, Field))
    def immutable(
        cls: type[_T] | None = None, /, *, order: bool = False
    ) -> type[_T] | Callable[[type[_T]], type[_T]]:
        """Type checkers see a frozen dataclass (slots are not part of the transform)."""

else:

    def immutable(cls=None, /, *, order=False):
        """`@immutable` or `@immutable(order=True)`: a frozen, slotted dataclass."""
        if cls is None:
            return lambda cls: _make(cls, order)
        return _make(cls, order)
