"""Regular expressions compiled when first used, for modules a short process imports but
seldom needs all of (the exec probe imports the redaction rules to mask what it prints; a
healthy probe's output is checked by one cheap expression and never reaches the others).

`on_first_use(globals(), "NAME", pattern)` is a stand-in for `re.compile(pattern)`: the
first attribute read (`NAME.search`, `NAME.sub`, ...) compiles the expression and binds it
under `NAME` in the module, in place of the stand-in. The module's functions read the
global on each call, so from then on they use the compiled pattern itself, at no cost.
"""

from __future__ import annotations

import re
from typing import Any, cast

__all__ = ["on_first_use"]


class _OnFirstUse:
    __slots__ = ("_flags", "_name", "_namespace", "_pattern")

    def __init__(self, namespace: dict[str, Any], name: str, pattern: str, flags: int) -> None:
        self._namespace = namespace
        self._name = name
        self._pattern = pattern
        self._flags = flags

    def __getattr__(self, attribute: str) -> Any:
        if self._namespace.get(self._name) is not self:
            raise RuntimeError(f"{self._name} is not bound to its on_first_use stand-in")
        compiled = re.compile(self._pattern, self._flags)
        self._namespace[self._name] = compiled
        return getattr(compiled, attribute)


def on_first_use(
    namespace: dict[str, Any], name: str, pattern: str, flags: int = 0
) -> re.Pattern[str]:
    """`re.compile(pattern, flags)`, deferred to the first use of `namespace[name]`."""
    return cast("re.Pattern[str]", _OnFirstUse(namespace, name, pattern, flags))
