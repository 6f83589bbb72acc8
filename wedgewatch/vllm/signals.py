"""The one module that knows vLLM's metric names: `/metrics` text -> per-engine readings.

Rules (what is read, and why)
-----------------------------
A vLLM server cannot be asked for a subset of its metrics (`GET /metrics` ignores `name[]`,
and `/metrics/?name[]=` is empty in multiprocess mode), so every scrape is the whole body:
about 50 KB for one engine, several times that with data parallelism. `parse` therefore
reads only the sample lines whose metric name is *exactly* one of these, and skips every
other line without per-line Python work (one compiled regex over the body):

============================================  ========  =================================
sample name                                   needed?   becomes
============================================  ========  =================================
`vllm:num_requests_running`                   required  `running`
`vllm:num_requests_waiting`                   required  `waiting`
`vllm:num_requests_waiting_by_reason`         optional  `waiting_by_reason` ({} if absent)
`vllm:kv_cache_usage_perc`                    optional  `kv_cache_usage` (None if absent)
`vllm:engine_sleep_state{sleep_state=awake}`  optional  `awake` (None if absent or NaN)
`vllm:prompt_tokens_total`                    required  `prompt_tokens`
`vllm:generation_tokens_total`                required  `generation_tokens`
`vllm:request_success_total`                  required  `request_success` (sum over reasons),
                                                        `finished_by_reason` (each reason)
`vllm:prefix_cache_queries_total`             optional  `prefix_cache_queries` (None if absent)
`vllm:num_preemptions_total`                  required  `preemptions`
`vllm:iteration_tokens_total_count`           required  `iterations` (per-step heartbeat)
`process_start_time_seconds`                  optional  `process_start_time_seconds`
============================================  ========  =================================

`waiting_by_reason` keeps every `reason` label by name (vLLM prints `capacity` and
`deferred`), and `finished_by_reason` every `finished_reason` (`stop`, `length`, `abort`,
`error`, `repetition`): what each one means for progress is `wedgewatch.vllm.semantics`'
business, not this module's. `vllm:iteration_tokens_total` is a histogram family despite its
name; its `_count` sample is the number of engine steps that emitted tokens.

Every per-engine sample is keyed by its `model_name` and `engine` labels; the order of labels
is not relied on. A sample without an `engine` label belongs to engine "0" (vLLM V0 printed
no `engine` label and had exactly one engine); a sample without `model_name` is malformed.

Decisions, all returned as a `ParseFailure` with a specific message, never raised:

* **Required means required.** vLLM pre-creates every per-engine series at start-up, so a
  real exposition always has all required samples for every engine it mentions (0.0 before
  the first request). An engine that has some of them but lacks another, say its gauges
  but not `vllm:generation_tokens_total`, is a failure naming the engine and the missing
  names: such a body was cut off at a line boundary or comes from a vLLM that renamed a
  counter. Reading the missing counter as 0.0 would make it look flat, or reset, which is
  exactly the evidence the wedge detector acts on, so a guess is worse than a failure.
  Optional families (by-reason, KV usage, sleep state, process start time) may be absent.
* **Truncation.** The text format requires the last line to end with a line feed; a
  non-empty body that does not is truncated mid-line (a body cap, a dropped connection)
  and is a failure, because its last value may be cut short ("12" of "123.0"). A body cut
  at a line boundary is caught by the required-families rule above.
* **Malformed needed lines** are a failure that names the line number. Lines of families
  that are not read are not validated (that is the point of skipping them).
* **Duplicate samples**, two samples for the same engine and series (two bodies
  concatenated, or an extra label such as `pid` that splits a series), are a failure:
  picking one would be arbitrary, and summing `request_success_total` would double count.
* **Not vLLM at all** (empty, binary, HTML, JSON, OpenMetrics-escaped names, or valid
  Prometheus text without `vllm:num_requests_running`) is a failure saying which.
* **Bounded.** A body naming more than `max_engines` engines (default 256; a server has one
  per data-parallel rank) is a failure with reason `too_many_engines`, found while scanning,
  so thousands of engines under the byte cap never become thousands of readings. A label
  value read (`model_name`, `engine`, a reason) longer than `MAX_LABEL_CHARS` is cut with a
  marker and a digest of the whole (`truncate`), so a 2 MB model name never reaches a log
  line, a webhook or a remedy's environment, and two long names stay two engines. More
  than `MAX_SERIES_PER_ENGINE` reason series of one family for one engine is malformed.
* **Values** are taken as printed, including NaN and +/-Inf; `awake` is the `awake` series
  == 1, and None when that series is NaN (unknown must not read as "sleeping", which
  would silence the detector).

Sample lines in the canonical form `prometheus_client` writes (`name{a="x",b="y"} value`)
are split into labels and value by the same regex pass that finds them; any other needed
line (extra spaces, tabs, a timestamp in an odd place) goes to `prometheus_client`'s public
exposition parser, which is the authority on the grammar, and a line that parser rejects is
malformed.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import field
from typing import Final, Literal

from wedgewatch.core.values import immutable


@immutable(order=True)
class EngineKey:
    """Identifies one engine of a server: vLLM's `model_name` and `engine` labels."""

    model_name: str
    engine: str


@immutable
class EngineReading:
    """What one scrape says about one engine."""

    key: EngineKey
    running: float
    waiting: float
    waiting_by_reason: Mapping[str, float]
    kv_cache_usage: float | None
    awake: bool | None
    prompt_tokens: float
    generation_tokens: float
    request_success: float
    preemptions: float
    iterations: float
    finished_by_reason: Mapping[str, float] = field(default_factory=dict)
    prefix_cache_queries: float | None = None

    @property
    def deferred(self) -> float:
        """Requests parked in `skipped_waiting` (0 when the by-reason family is absent)."""
        return self.waiting_by_reason.get("deferred", 0.0)

    @property
    def capacity(self) -> float:
        """Requests in the FCFS `waiting` queue (total waiting on old vLLM without reasons)."""
        return self.waiting_by_reason.get(
            "capacity", self.waiting if not self.waiting_by_reason else 0.0
        )


@immutable
class Exposition:
    """A parsed `/metrics` body: one reading per engine."""

    engines: Mapping[EngineKey, EngineReading]
    process_start_time_seconds: float | None


@immutable
class ParseFailure:
    """A body that is not vLLM's exposition, with a specific reason."""

    message: str
    reason: Literal["parse_error", "too_many_engines"] = "parse_error"


#: Most engines one body may name (`parse(max_engines=...)`, setting `max_engines`).
DEFAULT_MAX_ENGINES: Final = 256
#: Most reason series (`reason`, `finished_reason`) one engine may have in one family.
MAX_SERIES_PER_ENGINE: Final = 32
#: Longest label value kept whole; a longer one is `truncate`d (a real model name is < 200).
MAX_LABEL_CHARS: Final = 256
#: The opening of `truncate`'s marker; what follows says how much was cut and digests the whole.
TRUNCATION_MARKER: Final = "…[+"


def truncate(text: str, max_chars: int = MAX_LABEL_CHARS) -> str:
    """`text` if it has at most `max_chars` characters, else its start and a marker saying
    how many characters were cut, with a digest of the whole so that two long values that
    share a prefix stay distinct: `aaaa…[+2097000 chars, #1f3a9c2e]`."""
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    if len(text) <= max_chars:
        return text
    import hashlib  # noqa: PLC0415 - only for a value this long: OpenSSL stays unloaded

    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{text[:max_chars]}{TRUNCATION_MARKER}{len(text) - max_chars} chars, #{digest}]"


RUNNING: Final = "vllm:num_requests_running"
WAITING: Final = "vllm:num_requests_waiting"
WAITING_BY_REASON: Final = "vllm:num_requests_waiting_by_reason"
KV_CACHE_USAGE: Final = "vllm:kv_cache_usage_perc"
SLEEP_STATE: Final = "vllm:engine_sleep_state"
PROMPT_TOKENS: Final = "vllm:prompt_tokens_total"
GENERATION_TOKENS: Final = "vllm:generation_tokens_total"
REQUEST_SUCCESS: Final = "vllm:request_success_total"
PREEMPTIONS: Final = "vllm:num_preemptions_total"
ITERATIONS: Final = "vllm:iteration_tokens_total_count"
PREFIX_CACHE_QUERIES: Final = "vllm:prefix_cache_queries_total"
PROCESS_START: Final = "process_start_time_seconds"

#: Every sample name `parse` reads; all other lines are skipped unread.
READ_NAMES: Final = (
    RUNNING,
    WAITING,
    WAITING_BY_REASON,
    KV_CACHE_USAGE,
    SLEEP_STATE,
    PROMPT_TOKENS,
    GENERATION_TOKENS,
    REQUEST_SUCCESS,
    PREEMPTIONS,
    ITERATIONS,
    PREFIX_CACHE_QUERIES,
    PROCESS_START,
)

#: Per-engine samples without which a reading is not trusted (see the module docstring).
REQUIRED_NAMES: Final = (
    RUNNING,
    WAITING,
    PROMPT_TOKENS,
    GENERATION_TOKENS,
    REQUEST_SUCCESS,
    PREEMPTIONS,
    ITERATIONS,
)

# One pass over "\n" + body finds every needed sample line: a line that starts with one of the
# needed names followed by "{" or a blank (so `vllm:num_requests_waiting` never swallows
# `vllm:num_requests_waiting_by_reason`). The regex engine skips every other line in C. The
# names are one prefix tree (`_trie`), so a line of another family fails on its first bytes
# that differ from every needed name, instead of trying each name in turn.
#
# A needed line in the canonical form `prometheus_client` writes (`{k="v",...} value`, an
# optional trailing comma in the braces, an optional integer timestamp) is split into its
# label text and value by the same pass (groups 2 and 3); any other needed line keeps its
# whole rest (group 4) and goes to the library. Label values are matched as "unrolled loops"
# (runs of plain characters between escapes), which the regex engine does about 4x faster
# than a per-character alternation.
_LABEL_VALUE = r'[^"\\\n]*(?:\\.[^"\\\n]*)*'
_LABEL = rf'[a-zA-Z_][a-zA-Z0-9_]*="{_LABEL_VALUE}"'
_VALUE = r"[-+]?(?:[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?|[0-9]+\.|Inf|NaN)"


def _trie(words: list[str]) -> str:
    """A regex matching exactly `words`, as a prefix tree of non-capturing groups."""
    if words == [""]:
        return ""
    branches: dict[str, list[str]] = {}
    for word in words:
        if word:
            branches.setdefault(word[0], []).append(word[1:])
    alternatives = [re.escape(first) + _trie(rests) for first, rests in sorted(branches.items())]
    optional = "" in words
    if len(alternatives) == 1 and not optional:
        return alternatives[0]
    return "(?:" + "|".join(alternatives) + ")" + ("?" if optional else "")


_NEEDED_LINE = re.compile(
    r"\n(" + _trie(sorted(READ_NAMES)) + r")(?:"
    rf"(?:\{{((?:{_LABEL}(?:,{_LABEL})*,?)?)\}})? ({_VALUE})(?: -?[0-9]+)?(?=\n|\Z)"
    r"|([{ \t][^\n]*))"
)
_LABEL_PAIR = re.compile(rf'([a-zA-Z_][a-zA-Z0-9_]*)="({_LABEL_VALUE})"')
_ESCAPE = re.compile(r'\\[\\n"]')
_UNESCAPED = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}

# The label that tells apart the several series one engine has in a family.
_SERIES_LABEL = {
    WAITING_BY_REASON: "reason",
    SLEEP_STATE: "sleep_state",
    REQUEST_SUCCESS: "finished_reason",
}

_EXCERPT_CHARS = 120


class _Malformed(Exception):
    """A needed line that cannot be read; the message says why."""


class _TooManyEngines(Exception):
    """The body names more engines than allowed."""


class _Engine:
    """Mutable accumulator for one engine while the body is scanned."""

    __slots__ = ("finished_by_reason", "seen", "values", "waiting_by_reason")

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.values: dict[str, float] = {}
        self.waiting_by_reason: dict[str, float] = {}
        self.finished_by_reason: dict[str, float] = {}


#: (model_name, engine) while scanning; EngineKey objects are built once per engine at the end.
_EngineId = tuple[str, str]


@immutable
class _Scan:
    """Everything the body said, before it is checked for completeness."""

    engines: dict[_EngineId, _Engine]
    process_start_time_seconds: float | None


def parse(
    body: bytes | str, *, max_engines: int = DEFAULT_MAX_ENGINES
) -> Exposition | ParseFailure:
    """Read every engine's signals from a full vLLM `/metrics` body, or say why it cannot."""
    if isinstance(body, bytes):
        decoded = _decode(body)
        if isinstance(decoded, ParseFailure):
            return decoded
        text = decoded
    else:
        text = body
    if not text or text.isspace():  # isspace stops at the first other character
        return ParseFailure("body is empty")
    scan = _scan(text, max_engines)
    if isinstance(scan, ParseFailure):
        return scan
    if not any(RUNNING in engine.seen for engine in scan.engines.values()):
        return ParseFailure(_not_vllm(text))
    if not text.endswith("\n"):
        return ParseFailure(_truncated(text))
    readings: dict[EngineKey, EngineReading] = {}
    for model_name, engine_label in sorted(scan.engines):
        key = EngineKey(model_name, engine_label)
        reading = _reading(key, scan.engines[model_name, engine_label])
        if isinstance(reading, ParseFailure):
            return reading
        readings[key] = reading
    return Exposition(engines=readings, process_start_time_seconds=scan.process_start_time_seconds)


def _decode(body: bytes) -> str | ParseFailure:
    """Decode a body as UTF-8, naming gzip and other binary bodies."""
    if body.startswith(b"\x1f\x8b"):
        return ParseFailure("body is gzip-compressed binary, not Prometheus text")
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as error:
        return ParseFailure(
            f"body is binary, not Prometheus text (invalid UTF-8 at byte {error.start})"
        )


def _scan(text: str, max_engines: int) -> _Scan | ParseFailure:
    """Read every needed sample line of the body; skip all others unread.

    Needed lines repeat a few label sets, and a server prints the same ones on every
    scrape, so where a canonical sample lands (its engine and series, `_slot_of`) is read
    from its name and label text once and remembered across bodies (`_SLOTS`).
    """
    scanned = "\n" + text
    engines: dict[_EngineId, _Engine] = {}
    seen: set[_Slot] = set()
    process_start: float | None = None
    slots = _SLOTS
    for match in _NEEDED_LINE.finditer(scanned):
        name, label_text, number, rest = match.groups()
        process = name == PROCESS_START
        try:
            if rest is not None:  # not in the canonical form
                labels, value = _read_sample_with_library(name, rest)
                slot = None if process else _slot_of(name, labels)
            else:
                value = float(number)
                label_text = label_text or ""
                slot = None if process else slots.get((name, label_text))
                if slot is None:
                    labels = _read_labels(name, label_text) if label_text else {}
                    if not process:
                        slot = _slot_of(name, labels)
                        if len(slots) >= _MAX_SLOTS_KEPT:  # ever-new label sets: start over
                            slots.clear()
                        slots[name, label_text] = slot
            if slot is None:  # the process start time
                if process_start is not None:
                    raise _Malformed(f"duplicate {PROCESS_START} sample")
                process_start = value
                continue
            _record(engines, seen, value, slot, max_engines)
        except _Malformed as error:
            return _malformed(text, scanned, match.start(), str(error))
        except _TooManyEngines:
            return ParseFailure(
                f"body names more than {max_engines} engines (max_engines); a vLLM server has "
                "one per data-parallel rank: is this an aggregated or hostile body?",
                reason="too_many_engines",
            )
    return _Scan(engines, process_start)


#: Where a per-engine sample lands in a reading: its name, its (model_name, engine) and, for
#: a family of several series per engine, its series label's value (cut to size).
_Slot = tuple[str, _EngineId, str | None]

#: (sample name, label text) -> its slot, for canonical lines, across bodies. Only label
#: texts that read without error are kept; bounded by `_MAX_SLOTS_KEPT` entries.
_SLOTS: dict[tuple[str, str], _Slot] = {}
_MAX_SLOTS_KEPT = 4096


def _slot_of(name: str, labels: Mapping[str, str]) -> _Slot:
    """Where a per-engine `name` sample with `labels` lands; `_Malformed` without a
    `model_name` label or without the label that tells its series apart."""
    engine_id = _engine_id(labels)
    if engine_id is None:
        raise _Malformed(f"{name} sample has no model_name label")
    series_label = _SERIES_LABEL.get(name)
    if series_label is None:
        return name, engine_id, None
    series = labels.get(series_label)
    if series is None:
        raise _Malformed(f"{name} sample has no {series_label} label")
    return name, engine_id, truncate(series)


def _engine_id(labels: Mapping[str, str]) -> _EngineId | None:
    """The (model_name, engine) a sample's labels name, cut to size; None without a model."""
    model_name = labels.get("model_name")
    if model_name is None:
        return None
    return truncate(model_name), truncate(labels.get("engine", "0"))


def _read_labels(name: str, label_text: str) -> dict[str, str]:
    """The labels of a canonical `name` sample, from the text between its braces."""
    pairs = _LABEL_PAIR.findall(label_text)
    labels = dict(pairs)
    if len(labels) != len(pairs):
        raise _Malformed(f"duplicate label name in a {name} sample")
    if "\\" in label_text:
        for label, raw in pairs:
            labels[label] = _ESCAPE.sub(_unescape, raw)
    return labels


def _read_sample_with_library(name: str, rest: str) -> tuple[dict[str, str], float]:
    """Hand a non-canonical needed line to prometheus_client's public exposition parser.

    Imported here, not at the top: canonical lines never need it, and its import would cost
    every exec probe (`wedgewatch check`) a noticeable share of its start-up. The line is
    parsed alone, without its `# TYPE` line, so the library keeps the sample's own name.
    """
    from prometheus_client.parser import (  # noqa: PLC0415 - see above
        text_string_to_metric_families,
    )

    try:
        # The parser's failure modes on hostile input are not documented (ValueError for
        # most, IndexError or KeyError for some lines), so any exception means "malformed".
        samples = [
            sample
            for family in text_string_to_metric_families((name + rest).strip() + "\n")
            for sample in family.samples
        ]
        if len(samples) != 1:
            raise ValueError(f"{len(samples)} samples on one line")
        sample = samples[0]
        labels = {str(k): str(v) for k, v in sample.labels.items()}
        value = float(sample.value)
    except Exception as error:
        # The library's message may quote the whole line: cut, the excerpt follows anyway.
        raise _Malformed(f"malformed {name} sample ({_cut(str(error))})") from error
    if sample.name != name:
        raise _Malformed(f"malformed {name} sample (read as {sample.name!r})")
    return labels, value


def _unescape(match: re.Match[str]) -> str:
    return _UNESCAPED[match.group(0)]


def _record(
    engines: dict[_EngineId, _Engine], seen: set[_Slot], value: float, slot: _Slot, max_engines: int
) -> None:
    """Fold one per-engine sample (landing in `slot`, from `_slot_of`) into its engine's
    accumulator.

    Two samples that would land in the same place of a reading (same name, engine and
    series label, e.g. two bodies concatenated, or an extra label such as `pid`) are refused.
    """
    name, engine_id, series = slot
    if slot in seen:
        raise _Malformed(f"duplicate {name} sample (its engine and labels were seen earlier)")
    seen.add(slot)
    engine = engines.get(engine_id)
    if engine is None:
        if len(engines) >= max_engines:
            raise _TooManyEngines
        engine = engines[engine_id] = _Engine()
    if series is None:
        engine.values[name] = value
    elif name == WAITING_BY_REASON:
        series_label = _SERIES_LABEL[name]
        _bounded_series(engine.waiting_by_reason, name, series_label, series)[series] = value
    elif name == REQUEST_SUCCESS:
        series_label = _SERIES_LABEL[name]
        engine.values[name] = engine.values.get(name, 0.0) + value
        _bounded_series(engine.finished_by_reason, name, series_label, series)[series] = value
    elif series == "awake":  # SLEEP_STATE; the sleep-level series do not decide `awake`
        engine.values[name] = value
    engine.seen.add(name)


def _bounded_series(
    series_map: dict[str, float], name: str, label: str | None, series: str
) -> dict[str, float]:
    """`series_map`, unless `series` would be one more than MAX_SERIES_PER_ENGINE in it."""
    if series not in series_map and len(series_map) >= MAX_SERIES_PER_ENGINE:
        raise _Malformed(
            f"more than {MAX_SERIES_PER_ENGINE} {label} values of {name} for one engine "
            "(vLLM has a handful)"
        )
    return series_map


def _reading(key: EngineKey, engine: _Engine) -> EngineReading | ParseFailure:
    """Freeze one engine's accumulator, or name the required samples it lacks."""
    missing = [name for name in REQUIRED_NAMES if name not in engine.seen]
    if missing:
        return ParseFailure(
            f"engine {key.engine!r} of model {key.model_name!r} has no {', '.join(missing)} "
            "sample: truncated body or an unsupported vLLM version"
        )
    values = engine.values
    awake_value = values.get(SLEEP_STATE)
    awake = None if awake_value is None or math.isnan(awake_value) else awake_value == 1.0
    return EngineReading(
        key=key,
        running=values[RUNNING],
        waiting=values[WAITING],
        waiting_by_reason=engine.waiting_by_reason,
        kv_cache_usage=values.get(KV_CACHE_USAGE),
        awake=awake,
        prompt_tokens=values[PROMPT_TOKENS],
        generation_tokens=values[GENERATION_TOKENS],
        request_success=values[REQUEST_SUCCESS],
        preemptions=values[PREEMPTIONS],
        iterations=values[ITERATIONS],
        finished_by_reason=engine.finished_by_reason,
        prefix_cache_queries=values.get(PREFIX_CACHE_QUERIES),
    )


def _cut(text: str) -> str:
    """`text` at most `_EXCERPT_CHARS` characters long (a library's message quoting a line)."""
    return text if len(text) <= _EXCERPT_CHARS else text[:_EXCERPT_CHARS] + "..."


def _excerpt(text: str) -> str:
    """A short, quoted excerpt of body text for a failure message."""
    if len(text) <= _EXCERPT_CHARS:
        return repr(text)
    return repr(text[:_EXCERPT_CHARS]) + "..."


def _malformed(text: str, scanned: str, start: int, problem: str) -> ParseFailure:
    """Failure for an unreadable needed line at offset `start` of "\\n" + text."""
    line_number = scanned.count("\n", 0, start + 1)
    end = scanned.find("\n", start + 1)
    line = scanned[start + 1 :] if end == -1 else scanned[start + 1 : end]
    if end == -1 and not text.endswith("\n"):
        return ParseFailure(
            f"body is truncated: line {line_number} ends without a newline: {_excerpt(line)}"
        )
    return ParseFailure(f"line {line_number}: {problem}: {_excerpt(line)}")


def _truncated(text: str) -> str:
    last_line = text[text.rfind("\n") + 1 :]
    line_number = text.count("\n") + 1
    return f"body is truncated: line {line_number} ends without a newline: {_excerpt(last_line)}"


def _not_vllm(text: str) -> str:
    """Say what a body without any vllm:num_requests_running sample looks like instead."""
    stripped = text.lstrip()
    if "\x00" in text:
        return "body is binary, not Prometheus text (contains NUL bytes)"
    if stripped.startswith("<"):
        return f"body is HTML, not Prometheus text (starts with {_excerpt(stripped)})"
    if stripped[:1] in ("{", "["):
        try:
            json.loads(text)
        except (ValueError, RecursionError):  # RecursionError: absurdly deep nesting
            pass
        else:
            return f"body is JSON, not Prometheus text (starts with {_excerpt(stripped)})"
    if "vllm_num_requests_running" in text:
        return (
            "no vllm:num_requests_running samples, but vllm_num_requests_running is present: "
            "the body uses OpenMetrics-escaped names; request plain text (Accept: text/plain)"
        )
    suffix = "" if text.endswith("\n") else "; the body also ends mid-line (truncated?)"
    if "\nvllm:" in "\n" + text:
        return (
            "no vllm:num_requests_running samples although other vllm: samples are present: "
            f"truncated body or an unsupported vLLM version{suffix}"
        )
    return (
        "no vllm:num_requests_running samples: not a vLLM /metrics body or stats disabled "
        f"(--disable-log-stats){suffix}"
    )


# --------------------------------------------------------------------------- vLLM's watchdog
# Kept apart from `parse` (the per-scrape path): read once per evidence capture.

#: The counter a vLLM with the stack-dump watchdog may export (RFC #56816); none of the
#: releases read through 0.34.0 does, which ship the watchdog's dump files only.
WATCHDOG_TIMEOUTS: Final = "vllm:watchdog_timeouts_total"
#: Most series of the watchdog counter kept from one body.
MAX_WATCHDOG_SERIES: Final = 64


def watchdog_timeouts(body: bytes | str) -> dict[str, float]:
    """`vllm:watchdog_timeouts_total` by its label set as printed (`engine="0",name="engine_0"`,
    or "" without labels), finite values only; {} when the body has none or is not text."""
    if isinstance(body, bytes):
        try:
            body = body.decode("utf-8")
        except UnicodeDecodeError:
            return {}
    found: dict[str, float] = {}
    start = body.find(WATCHDOG_TIMEOUTS)
    while start != -1 and len(found) < MAX_WATCHDOG_SERIES:
        end = body.find("\n", start)
        line = body[start : end if end != -1 else len(body)]
        at_line_start = start == 0 or body[start - 1] == "\n"  # not in a `# HELP` line
        start = -1 if end == -1 else body.find(WATCHDOG_TIMEOUTS, end)
        rest = line[len(WATCHDOG_TIMEOUTS) :]
        labels = ""
        if rest.startswith("{"):
            close = rest.rfind("}")
            if close == -1:
                continue
            labels, rest = rest[1:close], rest[close + 1 :]
        elif not rest.startswith((" ", "\t")):
            continue  # another family whose name starts the same way
        parts = rest.split()
        if not at_line_start or not parts:
            continue
        try:
            value = float(parts[0])
        except ValueError:
            continue
        if math.isfinite(value):
            found[truncate(labels)] = value
    return found
