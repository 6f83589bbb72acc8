"""How each setting of `Config` is spelled (TOML key, flag, variable) and documented.

Shared by the loader (`config.sources`), the CLI flags and the generated reference.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from wedgewatch.config.model import ENV_PREFIX, Config
from wedgewatch.core.values import immutable

# ---------------------------------------------------------------------------------------
# Field metadata shared by the loader, the CLI flags and the generated reference.


@immutable
class Setting:
    """How one field is spelled and documented."""

    name: str
    section: str
    description: str
    default: Any
    flag: str
    env: str
    kind: Literal["scalar", "bool", "list", "argv", "targets", "table"]
    rules: tuple[str, ...]


def _kind(name: str) -> Literal["scalar", "bool", "list", "argv", "targets", "table"]:
    if name == "targets":
        return "targets"
    if name == "profiles":
        return "table"
    if name in ("exec_command", "on_bundle"):
        return "argv"
    annotation = Config.model_fields[name].annotation
    if annotation is bool:
        return "bool"
    if annotation == tuple[str, ...]:
        return "list"
    return "scalar"


def _rules(name: str) -> tuple[str, ...]:
    field = Config.model_fields[name]
    words = {"gt": "greater than", "ge": "at least", "lt": "less than", "le": "at most"}
    rules: list[str] = []
    for meta in field.metadata:
        for attr, word in words.items():
            bound = getattr(meta, attr, None)
            if bound is not None:
                rules.append(f"{word} {bound}")
        min_length = getattr(meta, "min_length", None)
        if min_length:
            rules.append("not empty")
    annotation = str(field.annotation)
    if annotation.startswith("typing.Literal"):
        choices = ", ".join(f"`{choice}`" for choice in field.annotation.__args__)  # type: ignore[union-attr]
        rules.append(f"one of {choices}")
    return tuple(rules)


def settings() -> tuple[Setting, ...]:
    """Every field of `Config`, in declaration order, with its spellings."""
    result = []
    for name, field in Config.model_fields.items():
        extra = field.json_schema_extra
        assert isinstance(extra, dict)  # noqa: S101 - every field is declared with _setting
        result.append(
            Setting(
                name=name,
                section=str(extra["section"]),
                description=field.description or "",
                default=field.default,
                flag=str(extra.get("flag", "--" + name.replace("_", "-"))),
                env=ENV_PREFIX + name.upper(),
                kind=_kind(name),
                rules=_rules(name),
            )
        )
    return tuple(result)


SETTINGS: Mapping[str, Setting] = {setting.name: setting for setting in settings()}
