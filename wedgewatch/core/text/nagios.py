"""The Nagios plugin conventions `wedgewatch check` follows: threshold ranges and perfdata.

From the Monitoring Plugins Development Guidelines:

* A threshold is a range `[@][start:][end]`: `10` is 0..10, `10:` is 10..infinity, `~:10`
  is -infinity..10, `10:20` is 10..20. A value *outside* the range alerts; with a leading
  `@` a value *inside* it alerts. So `-w 30` warns when a value is below 0 or above 30.
* Performance data follow the text after a `|`, space separated, each
  `'label'=value[UOM];[warn];[crit];[min];[max]`. A label may hold any character but `'`
  and `=`; it is quoted when it holds anything but letters, digits and `_` (as the
  `nagiosplugin` library does). Trailing empty fields are dropped.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

from wedgewatch.core.values import immutable

_WORD = re.compile(r"^\w+$", re.ASCII)


@immutable
class Range:
    """A threshold range; `alerts(value)` says whether `value` crosses it."""

    start: float
    end: float
    inside: bool  # `@`: alert inside start..end rather than outside
    text: str  # as the user gave it, echoed into the perfdata

    @classmethod
    def parse(cls, spec: str) -> Range:
        """The range `spec` says; ValueError with a specific message when it is not one."""
        text = spec.strip()
        body = text.removeprefix("@")
        if not body:
            raise ValueError(f"{spec!r} is not a Nagios range ([@][start:][end], e.g. 30)")
        start_text, colon, end_text = body.rpartition(":")
        if not colon:
            start_text, end_text = "", body
        start = -math.inf if start_text == "~" else _number(start_text, 0.0, spec)
        end = _number(end_text, math.inf, spec)
        if start > end:
            raise ValueError(f"{spec!r}: the start {start:g} is above the end {end:g}")
        return cls(start=start, end=end, inside=text.startswith("@"), text=text)

    def alerts(self, value: float) -> bool:
        """True when `value` is outside the range (inside it with `@`)."""
        outside = value < self.start or value > self.end
        return not outside if self.inside else outside


def _number(text: str, default: float, spec: str) -> float:
    if text == "":
        return default
    try:
        value = float(text)
    except ValueError:
        raise ValueError(
            f"{spec!r} is not a Nagios range: {text!r} is not a number "
            "([@][start:][end], e.g. 30, 10:, ~:60, @10:20)"
        ) from None
    if not math.isfinite(value):
        raise ValueError(f"{spec!r} is not a Nagios range: {text!r} is not a finite number")
    return value


@immutable
class PerfDatum:
    """One performance datum: `'label'=value[uom];[warn];[crit];[min];[max]`."""

    label: str
    value: float
    uom: str = ""
    warn: str = ""
    crit: str = ""
    minimum: float | None = None
    maximum: float | None = None

    def render(self) -> str:
        """The datum as the guidelines write it, trailing empty fields dropped."""
        fields = [
            f"{quote_label(self.label)}={_plain(self.value)}{self.uom}",
            self.warn,
            self.crit,
            "" if self.minimum is None else _plain(self.minimum),
            "" if self.maximum is None else _plain(self.maximum),
        ]
        while fields[-1] == "":
            fields.pop()
        return ";".join(fields)


def label_part(text: str) -> str:
    """`text` made fit for a label: `'`, `=`, `|` and white space become `_`."""
    return re.sub(r"['=|\s]", "_", text)


def quote_label(label: str) -> str:
    """The label quoted unless it is only letters, digits and `_`."""
    label = label_part(label)
    return label if _WORD.match(label) else f"'{label}'"


def render_perfdata(data: Iterable[PerfDatum]) -> str:
    """Data separated by spaces, as they follow the `|`."""
    return " ".join(datum.render() for datum in data)


def _plain(value: float) -> str:
    """A number without exponent: an integer as such, else at most 3 decimals."""
    if value == int(value):
        return str(int(value))
    return f"{value:.3f}".rstrip("0").rstrip(".")
