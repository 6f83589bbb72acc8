"""wedgewatch's one configuration model, loaded from defaults < TOML < environment < flags.

Every setting is a field of the frozen `Config` model, spelled the same everywhere: the
field `stall_after_seconds` is the TOML key `stall_after_seconds`, the environment
variable `WEDGEWATCH_STALL_AFTER_SECONDS` and the flag `--stall-after-seconds`. The
only exceptions are the list settings, whose flags are singular and repeatable
(`--target`, `--webhook-url`). `config.sources.load_config` merges the four sources,
records where every value came from, and turns validation failures into one clear message
per field; `config.reference` renders the model. Components never see the whole model:
they receive a narrowed slice (`Config.detection_policy()`, `Config.scrape_limits()`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, cast

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from wedgewatch.config.plain import (
    ConfigViews,
    PlainConfig,
    PlainTarget,
    TargetViews,
    check_http_url,
    default_target_name,
    parse_byte_size,
)
from wedgewatch.core.detection.canary import CanaryPolicy
from wedgewatch.core.detection.detect import DetectionPolicy
from wedgewatch.core.detection.states import THRESHOLD_SETTING, THRESHOLD_SETTINGS, Family
from wedgewatch.core.restart.restart_policy import RestartPolicy
from wedgewatch.core.text.redact import redact_url
from wedgewatch.io.procs import remote_host_reason
from wedgewatch.vllm.profiles import builtin_profiles, merge_profiles

# The defaults of every setting that a core dataclass also holds come from that dataclass, so
# each default is written once (tests/config/test_config.py checks
# `Config().detection_policy() == DetectionPolicy()`).
_DETECTION = DetectionPolicy()
_RESTART = RestartPolicy()
_CANARY = CanaryPolicy()

ENV_PREFIX = "WEDGEWATCH_"
#: The one `WEDGEWATCH_*` variable that is not a setting: the config file, like `--config`.
CONFIG_FILE_ENV = "WEDGEWATCH_CONFIG"

SECTIONS: Mapping[str, str] = {
    "detection": "How an engine is judged: the scrape cadence and how long each kind of "
    "stall must last before it counts as a wedge.",
    "scraping": "How one scrape of a target's `/metrics` is bounded.",
    "targets": "The vLLM servers to watch.",
    "canary": "An optional tiny request through the server's real queue, for the hangs that "
    "`/metrics` cannot show (vLLM #46811: the engine blocks inside a step and every "
    "published value freezes, often at idle). Off by default.",
    "daemon": "The long-running `wedgewatch run` process and its own HTTP endpoints.",
    "evidence": "What is captured when an engine turns suspect or wedged, and how much is kept.",
    "remedy": "What is done about a wedged engine, and how often it may be done.",
    "notify": "Webhook notifications about state changes.",
    "launcher": "Launch profiles for `wedgewatch launch` (see docs/launcher.md).",
}

MIB = 1024 * 1024
_TARGET_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\[\]-]{0,63}$")
#: The thresholds a scrape observes: each must be at least interval_seconds. Not the
#: deferred-only one (0 turns it off; its own rule) nor the canary's (a canary's own clock).
_SCRAPED_THRESHOLDS = tuple(
    name
    for name in THRESHOLD_SETTINGS
    if name
    not in (THRESHOLD_SETTING[Family.DEFERRED_ONLY_STALL], THRESHOLD_SETTING[Family.CANARY_STALL])
)


class FieldRuleError(ValueError):
    """A cross-field rule broken by one field, so the message can name that field."""

    def __init__(self, field: str, value: object, rule: str) -> None:
        self.field = field
        self.value = value
        self.rule = rule
        super().__init__(f"{field} = {value!r}: {rule}")


class Target(TargetViews, BaseModel):
    """One vLLM server to watch."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(
        description="A short unique name used in logs, metrics and evidence paths "
        "(default: `host:port` of the URL).",
    )
    url: str = Field(
        description="The server's base URL (`http://127.0.0.1:8000`) or its `/metrics` URL."
    )
    pid: int | None = Field(
        default=None, gt=0, description="The API server's process id, when known."
    )
    pid_file: Path | None = Field(
        default=None, description="A file holding the API server's process id."
    )
    systemd_unit: str | None = Field(
        default=None,
        min_length=1,
        description="The systemd unit running this server (overrides `systemd_unit`).",
    )

    @model_validator(mode="before")
    @classmethod
    def _from_spec(cls, data: Any) -> Any:
        """Accept `"name=url"` / `"url"` strings and fill in a missing name from the URL."""
        if isinstance(data, str):
            data = parse_target_spec(data)
        if isinstance(data, Mapping) and "name" not in data and isinstance(data.get("url"), str):
            try:
                return {**data, "name": default_target_name(data["url"])}
            except ValueError:
                # The url validator reports the bad URL; a placeholder keeps the name quiet.
                return {**data, "name": "unnamed"}
        return data

    @field_validator("name")
    @classmethod
    def _check_name(cls, name: str) -> str:
        if not _TARGET_NAME_RE.match(name):
            raise ValueError(
                "must be 1-64 characters of letters, digits and . _ : - [ ], "
                "starting with a letter or digit"
            )
        return name

    @field_validator("url")
    @classmethod
    def _check_url(cls, url: str) -> str:
        return check_http_url(url)


def parse_target_spec(spec: str) -> dict[str, str]:
    """Split a `name=url` or bare `url` target spec (the environment and flag form)."""
    spec = spec.strip()
    name, sep, rest = spec.partition("=")
    if sep and "/" not in name and ":" not in name:
        return {"name": name.strip(), "url": rest.strip()}
    return {"url": spec}


def _setting(default: Any, section: str, description: str, **rules: Any) -> Any:
    """A field with its docs section; `flag` in `rules` overrides the flag spelling."""
    extra: dict[str, Any] = {"section": section}
    if "flag" in rules:
        extra["flag"] = rules.pop("flag")
    return Field(default=default, description=description, json_schema_extra=extra, **rules)


def _signal_targets_are_local(targets: Sequence[Target]) -> None:
    """`remedy = "signal"` acts on local processes only: a target on another host must name
    its process (`pid`, `pid_file`), or the configuration is refused naming it."""
    for target in targets:
        if target.pid is not None or target.pid_file is not None:
            continue  # the operator named the server's process
        remote = remote_host_reason(target.url)
        if remote is not None:
            raise FieldRuleError(
                "remedy",
                "signal",
                f"target {target.name!r} ({redact_url(target.url)}): "
                f'{remote}; remedy = "signal" only acts on a server on this machine '
                "(use a loopback or local address, or set the target's pid or "
                'pid_file), or use remedy = "exec" or "systemd"',
            )


class Config(ConfigViews, BaseModel):
    """Every wedgewatch setting (see docs/configuration.md, generated from this model)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # -- detection -------------------------------------------------------------------
    interval_seconds: float = _setting(
        1.0,
        "detection",
        "Time between two scrapes of a target. One second resolves a stall well below any "
        "threshold and costs one small parse per second.",
        gt=0,
    )
    stall_after_seconds: float = _setting(
        _DETECTION.stall_after_seconds,
        "detection",
        "How long nothing may run while requests wait (`deferred_stall`, `admission_stall`) "
        "with every progress counter flat before the engine is wedged. Transient deferrals "
        "(KV transfers, grammar compiles) clear within seconds; the reported wedges never "
        "clear.",
        gt=0,
    )
    hang_after_seconds: float = _setting(
        _DETECTION.hang_after_seconds,
        "detection",
        "How long requests may run with every progress counter flat (`progress_stall`) before "
        "the engine is wedged. Longer than `stall_after_seconds` because a long chunked "
        "prefill moves no counter until it completes.",
        gt=0,
    )
    output_stall_after_seconds: float = _setting(
        _DETECTION.output_stall_after_seconds,
        "detection",
        "How long prefill or preemption counters may move while neither generated tokens nor "
        "finished requests do (`output_stall`, a livelock) before the engine is wedged.",
        gt=0,
    )
    deferred_only_after_seconds: float = _setting(
        _DETECTION.deferred_only_after_seconds,
        "detection",
        "Like `stall_after_seconds`, for requests deferred while nothing runs or waits for "
        "capacity (`deferred_only_stall`); 0 disables it. Long because streaming-input "
        "sessions, P/D decode nodes and grammar compiles defer for minutes; a lost KV-offload "
        "write (vLLM #49829) never clears. docs/runbook.md says when to raise it.",
        ge=0,
    )
    unreachable_after_seconds: float = _setting(
        _DETECTION.unreachable_after_seconds,
        "detection",
        "How long scrapes may fail, after the target was once seen up, before it is "
        "`unreachable`. Short outages (a restart, a busy API server) stay below it.",
        gt=0,
    )
    startup_timeout_seconds: float = _setting(
        _RESTART.startup_timeout_seconds,
        "detection",
        "How long a target that has never answered stays `starting` before it is "
        "`unreachable`. Loading a large model takes minutes.",
        gt=0,
    )

    # -- scraping --------------------------------------------------------------------
    scrape_timeout_seconds: float = _setting(
        5.0,
        "scraping",
        "Deadline for one scrape: connecting, the response and the whole body. A body that "
        "trickles in slower than this is a `timeout`.",
        gt=0,
    )
    max_body_bytes: int = _setting(
        16 * MIB,
        "scraping",
        "Largest `/metrics` body read (after gzip decoding). A single engine's body is about "
        "50 KB; anything past the cap is `too_large` and is not read further. Accepts units: "
        "`16MiB`.",
        ge=1024,
    )
    max_engines: int = _setting(
        _DETECTION.max_engines,
        "scraping",
        "Most engines (data-parallel ranks) one target may name, in one body and across "
        "scrapes (engines gone from `/metrics` count until they expire, "
        f"{_DETECTION.vanished_engine_expiry_seconds:g} s after they "
        "vanished); more is a failed scrape (`too_many_engines`) and no engine is added, so "
        "a hostile target never makes wedgewatch grow.",
        ge=1,
    )

    # -- targets ---------------------------------------------------------------------
    targets: tuple[Target, ...] = _setting(
        (),
        "targets",
        "The servers to watch. In TOML an array of tables (`[[targets]]` with `name`, `url` "
        "and optionally `pid`, `pid_file`, `systemd_unit`) or of `name=url` strings; in the "
        "environment a comma-separated list of `name=url` or bare URLs; as a flag repeat "
        "`--target [name=]URL`.",
        flag="--target",
    )

    # -- canary ----------------------------------------------------------------------
    canary_interval_seconds: float = _setting(
        _CANARY.interval_seconds,
        "canary",
        "How long a target must have shown no progress (and had no canary) before wedgewatch "
        "sends one canary: `POST /v1/completions`, one token, temperature 0, marked with the "
        "`user` `wedgewatch-canary` and an `X-Request-Id` starting `wedgewatch-canary-`. "
        "0 turns the canary off. A busy server proves itself and never gets one; a sleeping, "
        "starting or restarting engine never gets one; at most one is in flight per target.",
        ge=0,
    )
    canary_timeout_seconds: float = _setting(
        _CANARY.timeout_seconds,
        "canary",
        "How long a canary may wait for its first token. No token within it while every "
        "progress counter stayed flat is a wedge (`canary_stall`); no token while counters "
        "moved is latency, counted in `wedgewatch_canary_failures_total` and never acted on.",
        gt=0,
    )
    canary_model: str = _setting("", "canary", "The canary's model; empty: `/v1/models`' first.")
    canary_max_tokens: int = _setting(1, "canary", "The canary's `max_tokens`.", ge=1, le=16)
    canary_prompt: str = _setting("Say OK.", "canary", "The canary's prompt.", min_length=1)

    # -- daemon ----------------------------------------------------------------------
    listen_host: str = _setting(
        "127.0.0.1",
        "daemon",
        "Address wedgewatch's own HTTP endpoints (`/health`, `/probe`, `/metrics`, `/status`) "
        "listen on. Use `0.0.0.0` to be reachable from outside the host or pod.",
        min_length=1,
    )
    listen_port: int = _setting(
        9321,
        "daemon",
        "Port of wedgewatch's own HTTP endpoints (0 picks a free port).",
        ge=0,
        le=65535,
    )
    state_dir: Path = _setting(
        Path("/var/lib/wedgewatch"),
        "daemon",
        "Directory for state that must survive a wedgewatch restart (restart budget, "
        "detector state).",
    )
    history_seconds: float = _setting(
        600.0,
        "daemon",
        "Length of the in-memory flight recorder of readings and verdicts per target, "
        "written into every evidence bundle.",
        gt=0,
    )
    history_max_bytes: int = _setting(
        4 * MIB,
        "daemon",
        "Bound on one target's flight recorder, as the JSON bytes it takes in a bundle; the "
        "oldest entries go first. Accepts units: `4MiB`.",
        ge=1024,
    )
    log_level: Literal["debug", "info", "warning", "error"] = _setting(
        "info",
        "daemon",
        "Lowest level logged to stderr: debug, info, warning or error.",
    )

    # -- evidence --------------------------------------------------------------------
    evidence_dir: Path = _setting(
        Path("/var/lib/wedgewatch/evidence"),
        "evidence",
        "Directory that receives one evidence bundle per suspect or wedged episode.",
    )
    capture_locals: bool = _setting(
        False,
        "evidence",
        "Ask py-spy for local variables too (`--locals`). Slower and may expose request "
        "contents in the bundle.",
    )
    pyspy_path: str = _setting(
        "py-spy",
        "evidence",
        "The py-spy executable (a name looked up in PATH, or a path).",
        min_length=1,
    )
    pyspy_timeout_seconds: float = _setting(
        10.0,
        "evidence",
        "Deadline for one py-spy dump; a dump past it is killed so the target is never left "
        "suspended.",
        gt=0,
    )
    evidence_keep: int = _setting(
        20,
        "evidence",
        "How many evidence bundles are kept. Routine bundles (suspect episodes that "
        "recovered, manual captures) are evicted before wedge bundles, oldest first.",
        ge=1,
    )
    evidence_max_bytes: int = _setting(
        512 * MIB,
        "evidence",
        "Upper bound on the total size of kept evidence bundles, evicted like "
        "`evidence_keep`; the newest wedge bundle is never evicted. Accepts units: `512MiB`.",
        ge=1024,
    )
    process_sample_seconds: float = _setting(
        0.5,
        "evidence",
        "How long CPU usage of the server's processes is sampled for an evidence bundle.",
        gt=0,
    )
    profile_seconds: int = _setting(
        2,
        "evidence",
        "At the wedge, after the stack dumps, each EngineCore is sampled this many seconds "
        "with `py-spy record --nonblocking` (the server is never paused; idle samples are "
        "dropped, so the scheduler's frames show where single dumps mostly catch the "
        "engine's sleep between empty steps). The folded profile goes into the bundle and "
        "triage. Whole seconds (py-spy's unit); the wedge bundle, and a restart that follows "
        "it, take this much longer. 0 = no profile.",
        ge=0,
        le=60,
    )
    profile_rate_hz: int = _setting(
        50,
        "evidence",
        "Samples per second of the wedge-time profile (`profile_seconds`).",
        ge=1,
        le=1000,
    )
    watchdog_dump_dir: str = _setting(
        "",
        "evidence",
        "The directory vLLM's own stack-dump watchdog writes to (`--watchdog-config` "
        "`dump_dir`, vLLM 0.34 and later). Each bundle then carries its newest "
        "`VLLM_STACK_DUMP_for_<name>_<pid>.log` files and the report shows them beside "
        "py-spy's stacks. Empty = not read.",
    )
    suspect_capture_min_interval_seconds: float = _setting(
        600.0,
        "evidence",
        "At most one suspect-round capture per target within this many seconds. The suspect "
        "round runs while the engine may still be healthy (a long prefill, a short deferral); "
        "it is gentle (py-spy `--nonblocking`, one dump per process), and this limit keeps a "
        "target that flaps between ok and suspect from being sampled again and again. A "
        "wedge inside the window still gets a full bundle (one-shot). 0 = no limit.",
        ge=0,
    )
    on_bundle: tuple[str, ...] = _setting(
        (),
        "evidence",
        "A command run once per bundle when it is final (the wedge bundle, after its second "
        "round, even one that failed or was cut off at its time limit, which summary.json "
        "then records; never after the suspect round alone; the crash bundle of `launch "
        "--watch`), with the bundle directory as its last "
        "argument, as an argument list; in the environment and as a flag one shell-quoted "
        "string. It runs beside the watchdog (never delaying a scrape or the restart), "
        "without a shell, in its own session, with the minimal environment of "
        "`exec_command` plus `WEDGEWATCH_BUNDLE`, `WEDGEWATCH_TARGET` and "
        "`WEDGEWATCH_PHASE`; it is killed after `on_bundle_timeout_seconds`. Use it to ship "
        "bundles off the machine (deploy/hooks/upload-bundle.sh). Retention still applies "
        "to the bundles on disk. Empty: no hook.",
    )
    on_bundle_timeout_seconds: float = _setting(
        300.0,
        "evidence",
        "How long one `on_bundle` run may take before its whole process group is killed.",
        gt=0,
    )

    # -- remedy ----------------------------------------------------------------------
    remedy: Literal["none", "probe", "signal", "systemd", "exec", "supervise"] = _setting(
        "none",
        "remedy",
        "What is done to a wedged server: `none` (observe mode: report only; `/probe` "
        "never asks for a restart), `probe` (wedgewatch restarts nothing itself: `/probe` "
        "fails, so the kubelet's liveness probe restarts the server, within the restart "
        "budget; the Kubernetes manifests), `signal` "
        "(SIGTERM the server's process tree, SIGKILL after `grace_seconds`; only for servers "
        "on this machine, and only a tree with a `VLLM::EngineCore` process or named by the "
        "target's `pid` / `pid_file`), `systemd` (restart `systemd_unit`), `exec` (run "
        "`exec_command`) or `supervise` (wedgewatch runs the server itself and restarts it).",
    )
    grace_seconds: float = _setting(
        30.0,
        "remedy",
        "How long a stopping server may take to exit before it is killed.",
        ge=0,
    )
    restart_budget: int = _setting(
        _RESTART.restart_budget,
        "remedy",
        "How many restarts are allowed within `restart_budget_window_seconds`; past it "
        "wedgewatch gives up and only reports, so a wedge that returns at once cannot "
        "cause a restart storm.",
        ge=1,
    )
    restart_budget_window_seconds: float = _setting(
        _RESTART.restart_budget_window_seconds,
        "remedy",
        "The sliding window `restart_budget` counts restarts in.",
        gt=0,
    )
    restart_backoff_seconds: float = _setting(
        _RESTART.restart_backoff_seconds,
        "remedy",
        "Least time between two restarts; doubled after each restart that did not help.",
        ge=0,
    )
    restart_backoff_max_seconds: float = _setting(
        _RESTART.restart_backoff_max_seconds,
        "remedy",
        "Upper bound of the doubled restart back-off (at least `restart_backoff_seconds`).",
        ge=0,
    )
    probe_respects_budget: bool = _setting(
        True,
        "remedy",
        "Whether `/probe` and `check --state-file` fail for a wedge only while the restart "
        "budget and back-off allow a restart (then pass with `gave_up`); off: always fail.",
    )
    abort_first: bool = _setting(
        False,
        "remedy",
        "Try the abort cure before a restart: for a scheduler wedge (`deferred_stall`, "
        "`admission_stall`, `deferred_only_stall`; `output_stall` when the triage saw the "
        "engine loop run) wedgewatch asks vLLM to abort every in-flight request "
        "(`POST /abort_requests`, which vLLM serves with `VLLM_SERVER_DEV_MODE=1`) once the "
        "evidence is captured, then proves recovery by progress within 30 s; when it does "
        "not recover, or the wedge is a frozen loop, the `remedy` restarts the server. At "
        "most one abort per episode; needs a `remedy` other than `none` (observe mode acts "
        "on nothing) and a server proven to be vLLM (as for `signal`). See docs/remedies.md.",
    )
    systemd_unit: str = _setting(
        "vllm.service",
        "remedy",
        'The unit restarted by `remedy = "systemd"` (a target\'s own `systemd_unit` wins).',
        min_length=1,
    )
    exec_command: tuple[str, ...] = _setting(
        (),
        "remedy",
        'The command run by `remedy = "exec"` (required then), as an argument list; in the '
        "environment and as a flag one shell-quoted string. Run without a shell, with a "
        "minimal environment (`PATH`, `HOME`, `USER`, `LOGNAME`, `LANG`, `LC_ALL`, `TZ`, "
        "`TMPDIR`, `XDG_RUNTIME_DIR`, `KUBERNETES_SERVICE_HOST`, `KUBERNETES_SERVICE_PORT` "
        "when wedgewatch has them; never its settings or secrets); the verdict is passed in "
        "`WEDGEWATCH_TARGET`, `WEDGEWATCH_URL` (password and secret query values masked), "
        "`WEDGEWATCH_ENGINE`, `WEDGEWATCH_MODEL_NAME`, `WEDGEWATCH_FAMILY`, "
        "`WEDGEWATCH_STATE`, `WEDGEWATCH_REASON` and `WEDGEWATCH_BUNDLE`.",
    )

    # -- notify ----------------------------------------------------------------------
    webhook_urls: tuple[str, ...] = _setting(
        (),
        "notify",
        "URLs that receive a JSON POST on each notable event (wedge detected, target "
        "unreachable, engine recovered, restart requested/succeeded/failed, gave up, gave-up "
        "cleared), not on every state change. In the environment a comma-separated list; as "
        "a flag repeat `--webhook-url URL`. Their path and query (where Slack, Discord and "
        "Teams put the secret) are never printed: `config show --reveal` shows them.",
        flag="--webhook-url",
    )
    webhook_timeout_seconds: float = _setting(5.0, "notify", "Deadline for one webhook POST.", gt=0)
    webhook_retries: int = _setting(
        3,
        "notify",
        "How many times a failed webhook POST is retried (with back-off) before it is dropped.",
        ge=0,
    )

    # -- launcher --------------------------------------------------------------------
    profiles: Mapping[str, Any] = _setting(
        {},
        "launcher",
        "Launch profiles for `wedgewatch launch --profile NAME`, added to the shipped ones "
        "(`wedgewatch/vllm/profiles.toml`, listed by `wedgewatch launch --list-profiles`) or "
        "overriding a shipped profile "
        "key by key. In TOML one `[profiles.NAME]` table per profile with the keys "
        "`description`, `args`, `env`, `kv_cache_dtype`, `block_size`, `speculative_config` "
        "and `prefix_cache_retention_interval`; in the environment and as a flag the same "
        "as one JSON object.",
    )

    @field_validator("max_body_bytes", "evidence_max_bytes", "history_max_bytes", mode="before")
    @classmethod
    def _sizes(cls, value: object) -> object:
        return parse_byte_size(value)

    @field_validator("webhook_urls")
    @classmethod
    def _webhooks(cls, urls: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(check_http_url(url) for url in urls)

    @field_validator("profiles", mode="before")
    @classmethod
    def _profiles_json(cls, value: object) -> object:
        """The environment and flag spelling: one JSON object."""
        if not isinstance(value, str):
            return value
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"is not a JSON object of profiles ({exc.msg} at character {exc.pos})"
            ) from None

    @field_validator("profiles")
    @classmethod
    def _profiles(cls, profiles: Mapping[str, Any]) -> Mapping[str, Any]:
        """Each profile must merge onto the shipped ones: unknown keys and bad values fail here."""
        merge_profiles(builtin_profiles(), profiles)
        return profiles

    @field_validator("exec_command", "on_bundle")
    @classmethod
    def _argv(cls, argv: tuple[str, ...]) -> tuple[str, ...]:
        if argv and not argv[0].strip():
            raise ValueError("must start with the program to run, not an empty string")
        return argv

    @model_validator(mode="after")
    def _cross_field_rules(self) -> Config:
        names = [target.name for target in self.targets]
        for name in names:
            if names.count(name) > 1:
                raise FieldRuleError(
                    "targets",
                    name,
                    "two targets have this name; give each one a unique name (name=URL)",
                )
        if self.remedy == "signal":
            _signal_targets_are_local(self.targets)
        if self.remedy == "exec" and not self.exec_command:
            raise FieldRuleError(
                "exec_command", self.exec_command, 'must not be empty when remedy = "exec"'
            )
        if self.abort_first and self.remedy == "none":
            raise FieldRuleError(
                "abort_first",
                self.abort_first,
                'needs a remedy other than "none": observe mode acts on nothing (use '
                'remedy = "probe" in Kubernetes, or a restarting remedy, to escalate to when '
                "the abort does not cure the wedge)",
            )
        if self.restart_backoff_max_seconds < self.restart_backoff_seconds:
            raise FieldRuleError(
                "restart_backoff_max_seconds",
                self.restart_backoff_max_seconds,
                f"must be at least restart_backoff_seconds ({self.restart_backoff_seconds})",
            )
        for field in _SCRAPED_THRESHOLDS:
            value = getattr(self, field)
            if value < self.interval_seconds:
                raise FieldRuleError(
                    field,
                    value,
                    f"must be at least interval_seconds ({self.interval_seconds}): a stall "
                    "shorter than one scrape interval cannot be observed",
                )
        if 0 < self.deferred_only_after_seconds < self.interval_seconds:
            raise FieldRuleError(
                "deferred_only_after_seconds",
                self.deferred_only_after_seconds,
                f"must be 0 (disabled) or at least interval_seconds ({self.interval_seconds})",
            )
        return self


# -- the daemon's plain copy (`config.plain`) ---------------------------------------


def _plain_value(value: Any) -> Any:
    """A field's value with every target in it made plain."""
    if isinstance(value, Target):
        return PlainTarget({name: getattr(value, name) for name in Target.model_fields})
    if isinstance(value, tuple):
        return tuple(_plain_value(item) for item in value)
    if isinstance(value, Mapping):
        return {key: _plain_value(item) for key, item in value.items()}
    return value


def to_plain(config: Config) -> Config:
    """The plain copy of a validated `Config`: every field the model declares, same values.

    Typed as the model: it has the model's attributes and views, and that is what the
    daemon's code is checked against (it never calls pydantic's own methods).
    """
    values = {name: _plain_value(getattr(config, name)) for name in Config.model_fields}
    return cast("Config", PlainConfig(values))
