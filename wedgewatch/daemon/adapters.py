"""The real adapters of the daemon's roles and the `wedgewatch capture` command.

`real_deps(config)` is the composition root of production: an HTTP scraper, the evidence
bundle writer, the restarter of the configured remedy, webhooks, the state file and
systemd's sd_notify.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
from prometheus_client import CollectorRegistry

from wedgewatch.config.plain import default_target_name, metrics_url_of
from wedgewatch.core.detection.canary import CanaryResult
from wedgewatch.core.detection.detect import (
    Scraped,
    ScrapeFailed,
)
from wedgewatch.core.detection.states import CaptureFailureReason, CapturePhase
from wedgewatch.core.text.redact import redact_url
from wedgewatch.daemon.report import thresholds_of
from wedgewatch.daemon.roles import (
    AbortOutcome,
    CaptureOutcome,
    CaptureRequest,
    Clock,
    Deps,
    ScrapeResult,
)
from wedgewatch.io import abort, canary, evidence, restarters, statefile
from wedgewatch.io.bundle_hook import BundleHook
from wedgewatch.io.notify import Notification, WebhookNotifier
from wedgewatch.io.private_paths import private_dir
from wedgewatch.io.procs import ProcessSelector, PsutilProcessFinder
from wedgewatch.io.scrape import ScrapeClient, fetch, new_client, new_scrape_client
from wedgewatch.io.scrape_rules import FetchFailed, ScrapeLimits
from wedgewatch.io.supervisor import SystemdStateProbe
from wedgewatch.io.systemd_notify import SystemdNotifier
from wedgewatch.vllm import signals

if TYPE_CHECKING:
    import httpx

    from wedgewatch.config import Config, Target

log = structlog.get_logger("wedgewatch.daemon")

# Bodies at or above this size are parsed in a worker thread so the loop keeps ticking.
_THREAD_PARSE_BYTES = 512 * 1024


class SystemClock:
    """time.monotonic and time.time."""

    def monotonic(self) -> float:
        """Seconds on the monotonic clock."""
        return time.monotonic()

    def wall(self) -> float:
        """Unix time."""
        return time.time()


class AsyncioSleeper:
    """asyncio.sleep."""

    async def sleep(self, seconds: float) -> None:
        """Sleep on the event loop."""
        await asyncio.sleep(seconds)


class HttpCanary:
    """Sends canaries with `io.canary.send`; one client per target, kept between canaries."""

    def __init__(self, config: Config) -> None:
        self._config = config
        self._clients: dict[str, httpx.AsyncClient] = {}

    async def send(self, target: Target, sent_at: float) -> CanaryResult:
        """Send one canary to `target`, bounded by `canary_timeout_seconds`."""
        client = self._clients.get(target.name)
        if client is None:
            client = self._clients[target.name] = new_client(keepalive=1)
        config = self._config
        spec = canary.CanarySpec(
            base_url=canary.base_url_of(target.metrics_url),
            model=config.canary_model,
            prompt=config.canary_prompt,
            max_tokens=config.canary_max_tokens,
            timeout_seconds=config.canary_timeout_seconds,
        )
        return await canary.send(client, spec, sent_at=sent_at)

    async def aclose(self) -> None:
        """Close every client."""
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()


class HttpAborter:
    """The abort cure over HTTP (`io.abort`), then one canary (`io.canary`) as its proof.

    A client of its own per call: it never follows a redirect, and keeps nothing open
    between wedges (an abort is rare).
    """

    def __init__(self, config: Config) -> None:
        self._config = config

    async def abort(self, target: Target, *, proof_seconds: float) -> AbortOutcome:
        """POST the abort, then a canary bounded by `proof_seconds` (and the canary timeout)."""
        config = self._config
        limit = min(config.scrape_timeout_seconds * 2, proof_seconds)
        async with abort.new_abort_client() as client:
            sent = await abort.send_abort(client, target.metrics_url, timeout_seconds=limit)
            if not sent.ok:
                return AbortOutcome(False, sent.detail)
            spec = canary.CanarySpec(
                base_url=canary.base_url_of(target.metrics_url),
                model=config.canary_model,
                prompt=config.canary_prompt,
                max_tokens=config.canary_max_tokens,
                timeout_seconds=min(config.canary_timeout_seconds, proof_seconds),
            )
            result = await canary.send(client, spec, sent_at=time.monotonic())
        return AbortOutcome(
            True,
            sent.detail,
            aborted=sent.aborted,
            canary_ok=result.reason is None,
            canary_detail=result.detail or "",
        )


class HttpScraper:
    """Scrapes with `scrape.fetch` (bounded in time and size) and parses with `signals.parse`.

    Each target gets its own `ScrapeClient` that keeps its connection open between scrapes
    (the lean HTTP/1.1 client, `https://` targets sharing one TLS context):
    a connection pool's cost per request grows with its size, so one pool for many targets
    would make every scrape slower as targets are added.
    """

    def __init__(self, limits: ScrapeLimits, clock: Clock) -> None:
        self._limits = limits
        self._clock = clock
        self._tls: ssl.SSLContext | None = None
        self._clients: dict[str, ScrapeClient] = {}

    def _client(self, target: Target) -> ScrapeClient:
        client = self._clients.get(target.name)
        if client is None:
            tls = None
            if target.metrics_url.lower().startswith("https:"):
                if self._tls is None:
                    import httpx  # noqa: PLC0415 - only for https targets

                    self._tls = httpx.create_ssl_context()
                tls = self._tls
            client = self._clients[target.name] = new_scrape_client(tls)
        return client

    async def scrape(self, target: Target) -> ScrapeResult:
        """Fetch and parse once; the observation is stamped when the scrape began."""
        at = self._clock.monotonic()
        url = target.metrics_url
        result = await fetch(
            self._client(target),
            url,
            timeout_seconds=self._limits.timeout_seconds,
            max_body_bytes=self._limits.max_body_bytes,
            clock=self._clock.monotonic,
        )
        if isinstance(result, FetchFailed):
            failed = ScrapeFailed(at=at, reason=result.reason, detail=result.detail)
            return ScrapeResult(failed, None, result.elapsed_seconds)
        max_engines = self._limits.max_engines
        if len(result.body) >= _THREAD_PARSE_BYTES:
            parsed = await asyncio.to_thread(signals.parse, result.body, max_engines=max_engines)
        else:
            parsed = signals.parse(result.body, max_engines=max_engines)
        duration = self._clock.monotonic() - at
        if isinstance(parsed, signals.ParseFailure):
            detail = f"{redact_url(url)}: {parsed.message}"
            content_type = result.content_type or "none"
            if not content_type.lower().startswith("text/plain"):
                detail += f" (Content-Type: {content_type}; expected text/plain)"
            return ScrapeResult(ScrapeFailed(at, parsed.reason, detail), None, duration)
        return ScrapeResult(Scraped(at, parsed), result.body, duration)

    async def aclose(self) -> None:
        """Close the HTTP clients."""
        for client in self._clients.values():
            await client.aclose()


class BundleEvidence:
    """Evidence through `evidence.capture_bundle`: py-spy, process tree, metrics, history."""

    def __init__(self, deps: evidence.EvidenceDeps, thresholds: Mapping[str, float]) -> None:
        self._deps = deps
        self._thresholds = dict(thresholds)

    async def capture(self, request: CaptureRequest) -> CaptureOutcome:
        """Open (suspect) or complete (wedged) the episode's bundle."""
        target = request.target
        result = await evidence.capture_bundle(
            evidence.CaptureRequest(
                target=target.name,
                selector=process_selector(target),
                phase=request.phase,
                family=request.family,
                engine=request.key.engine,
                model_name=request.key.model_name,
                episode_id=request.episode_id,
                bundle=Path(request.bundle) if request.bundle else None,
                metrics_body=request.metrics_body,
                metrics_error=None if request.metrics_body is not None else "no good scrape kept",
                history=request.history,
                thresholds=self._thresholds,
                verdict=request.verdict,
                verdict_at=request.verdict_at,
            ),
            self._deps,
        )
        return CaptureOutcome(
            bundle=str(result.bundle) if result.bundle is not None else None,
            failures=capture_failure_reasons(result),
            triage=f"{result.triage.kind}: {result.triage.summary}"
            + (f" (known issue: {', '.join(result.known_issues)})" if result.known_issues else ""),
            detail="; ".join(result.failures),
            server_gone=result.server_gone,
            triage_kind=str(result.triage.kind),
        )

    async def cut_off(self, bundle: str, detail: str) -> None:
        """Record in the bundle that its wedged round was cut off at the time limit."""
        problem = await asyncio.to_thread(evidence.mark_cut_off, Path(bundle), self._deps, detail)
        if problem is not None:
            log.warning("bundle_cut_off_unrecorded", bundle=bundle, reason=problem)

    async def resolve(self, bundle: str, note: str) -> None:
        """Mark the bundle resolved so retention evicts it before wedge bundles."""
        problem = await asyncio.to_thread(evidence.resolve_bundle, Path(bundle), self._deps, note)
        if problem is not None:
            log.warning("bundle_resolve_failed", bundle=bundle, reason=problem)


def process_selector(target: Target) -> ProcessSelector:
    """How evidence finds a target's processes: its URL's listener, or its pid / pid file."""
    return ProcessSelector(
        url=target.url, pid=target.pid, pid_file=target.pid_file, systemd_unit=target.systemd_unit
    )


def capture_failure_reasons(result: evidence.BundleResult) -> tuple[CaptureFailureReason, ...]:
    """What went wrong in a capture, as the closed set of reasons of the failure counter.

    A server that is gone (crashed or stopped: nothing listens, its pid no longer runs) is
    an outcome, not a failure: the steps that need it (stacks, /version, process samples)
    have nothing to read. Only a bundle that could not be written or a capture that ran out
    of time still count then.
    """
    reasons: list[CaptureFailureReason] = []
    if result.bundle is None:
        reasons.append(CaptureFailureReason.WRITE_FAILED)
    if result.ptrace_denied and not result.server_gone:
        reasons.append(CaptureFailureReason.PTRACE_DENIED)
    if result.deadline_exceeded:
        reasons.append(CaptureFailureReason.TIMEOUT)
    if result.failures and not reasons and not result.server_gone:
        reasons.append(CaptureFailureReason.INCOMPLETE)
    return tuple(reasons)


class WebhookNotifications:
    """Sends the daemon's notable events through `notify.WebhookNotifier`.

    Which events are sent is the episode core's decision (`Report.notify`), not this adapter's.
    """

    def __init__(self, notifier: WebhookNotifier | None) -> None:
        self._notifier = notifier
        self._started = False

    def notify(self, event: str, payload: Mapping[str, Any]) -> None:
        """Queue the event for every webhook URL (none configured: nothing)."""
        if self._notifier is None:
            return
        if not self._started:
            self._notifier.start()  # needs the running loop; notify is called from it
            self._started = True
        reason = str(payload.get("reason") or "")
        detail = str(payload.get("detail") or "")
        if detail and detail != reason:  # a policy event: the code, then the sentence
            reason = f"{reason}: {detail}" if reason else detail
        self._notifier.notify(
            Notification(
                event=event,
                target=str(payload.get("target", "")),
                engine=str(payload.get("engine") or ""),
                model_name=str(payload.get("model_name") or ""),
                family=str(payload.get("family") or ""),
                state=str(payload.get("state") or ""),
                reason=reason,
                timestamp=float(payload.get("timestamp", time.time())),
                bundle=payload.get("bundle"),
            )
        )

    def failures(self) -> int:
        """Notifications dropped after their retries."""
        return 0 if self._notifier is None else self._notifier.stats.failed

    async def aclose(self, timeout_seconds: float) -> None:
        """Deliver what is queued, within the deadline."""
        if self._notifier is not None and self._started:
            await self._notifier.aclose(timeout_seconds)


class FileStateStore:
    """`statefile` under `state_dir`, holding the directory's exclusive lock while alive."""

    def __init__(self, state_dir: Path) -> None:
        locked = statefile.lock_state_dir(state_dir)
        if isinstance(locked, statefile.LockFailed):
            raise RuntimeError(locked.message)
        if locked.note is not None:
            log.warning("directory_mode_tightened", detail=locked.note)
        self._lock = locked
        self._dir = state_dir
        self._path = statefile.state_path(state_dir)

    def load(self) -> statefile.Loaded:
        """Read the state file (a corrupt one is set aside and reported)."""
        return statefile.load(self._path)

    def save(
        self, state: statefile.SavedState, timestamp: float
    ) -> statefile.Saved | statefile.SaveFailed:
        """Write it atomically."""
        return statefile.save(self._path, state, timestamp)

    def take_resets(self) -> statefile.ResetRequests:
        """Operator reset requests dropped into the state directory."""
        return statefile.take_reset_requests(self._dir)

    def close(self) -> None:
        """Release the state directory lock."""
        self._lock.release()


def evidence_settings(config: Config) -> evidence.EvidenceSettings:
    """The evidence slice of the configuration."""
    return evidence.EvidenceSettings(
        evidence_dir=config.evidence_dir,
        capture_locals=config.capture_locals,
        pyspy_path=config.pyspy_path,
        pyspy_timeout_seconds=config.pyspy_timeout_seconds,
        evidence_keep=config.evidence_keep,
        evidence_max_bytes=config.evidence_max_bytes,
        process_sample_seconds=config.process_sample_seconds,
        capture_deadline_seconds=capture_deadline_seconds(config),
        profile_seconds=config.profile_seconds,
        profile_rate_hz=config.profile_rate_hz,
        watchdog_dump_dir=config.watchdog_dump_dir,
    )


def capture_deadline_seconds(config: Config) -> float:
    """How long one capture may take: py-spy with and without --native, sampling, the
    wedge-time profile, writing."""
    return (
        2 * config.pyspy_timeout_seconds
        + config.process_sample_seconds
        + config.profile_seconds
        + 10.0
    )


def build_restarters(
    config: Config, supervisor: restarters.Supervisor | None = None
) -> dict[str, restarters.Restarter]:
    """One restarter per target for the configured remedy (none for `none` and `probe`:
    nothing, or the kubelet through `/probe`, restarts the server)."""
    built: dict[str, restarters.Restarter] = {}
    for target in config.targets:
        if config.remedy in ("none", "probe"):
            continue
        if config.remedy == "signal":
            built[target.name] = restarters.SignalRestarter(grace_seconds=config.grace_seconds)
        elif config.remedy == "systemd":
            unit = target.systemd_unit or config.systemd_unit
            built[target.name] = restarters.SystemdRestarter(unit)
        elif config.remedy == "exec":
            built[target.name] = restarters.ExecRestarter(config.exec_command)
        else:
            if supervisor is None:
                raise ValueError(
                    'remedy = "supervise" needs a server that wedgewatch runs itself: '
                    "use `wedgewatch launch --watch`"
                )
            built[target.name] = restarters.SuperviseRestarter(
                supervisor, grace_seconds=config.grace_seconds
            )
    return built


def real_deps(
    config: Config,
    *,
    supervisor: restarters.Supervisor | None = None,
    environ: Mapping[str, str] | None = None,
) -> Deps:
    """The production adapters; raises RuntimeError/ValueError for unusable settings.

    Takes the state directory's lock: a second wedgewatch on the same `state_dir` is
    refused (it would restart the same server twice).
    """
    if config.evidence_dir.exists():  # else created 0700 at the first capture
        try:
            note = private_dir(config.evidence_dir, "evidence_dir")
        except OSError as exc:
            raise RuntimeError(f"refusing evidence_dir: {exc}") from exc
        if note is not None:
            log.warning("directory_mode_tightened", detail=note)
    clock = SystemClock()
    finder = PsutilProcessFinder()
    thresholds = thresholds_of(config)
    webhooks = (
        WebhookNotifier(
            config.webhook_urls,
            timeout_seconds=config.webhook_timeout_seconds,
            retries=config.webhook_retries,
        )
        if config.webhook_urls
        else None
    )
    by_target = build_restarters(config, supervisor)
    return Deps(
        clock=clock,
        sleeper=AsyncioSleeper(),
        scraper=HttpScraper(config.scrape_limits(), clock),
        evidence=BundleEvidence(
            evidence.EvidenceDeps(settings=evidence_settings(config), finder=finder), thresholds
        ),
        restarters=by_target,
        finder=finder,
        notifier=WebhookNotifications(webhooks),
        state_store=FileStateStore(config.state_dir),
        service=SystemdNotifier.from_environ(environ),
        registry=CollectorRegistry(),
        serve_http=True,
        supervisor_probe=supervisor_probe(config),
        canary=HttpCanary(config) if config.canary_interval_seconds > 0 else None,
        bundle_hook=BundleHook(config.on_bundle, timeout_seconds=config.on_bundle_timeout_seconds)
        if config.on_bundle
        else None,
        aborter=HttpAborter(config) if config.abort_first and config.remedy != "none" else None,
    )


def supervisor_probe(config: Config) -> SystemdStateProbe | None:
    """Asks systemd about each target's unit (its `systemd_unit`, or `systemd_unit` with
    `remedy = "systemd"`) before a crashed server is restarted; None when no unit is known
    or nothing is restarted."""
    if config.remedy in ("none", "probe"):
        return None
    units = {
        t.name: unit
        for t in config.targets
        if (unit := t.systemd_unit or (config.systemd_unit if config.remedy == "systemd" else None))
    }
    return SystemdStateProbe(units) if units else None


async def capture_on_demand(
    config: Config,
    *,
    url: str | None = None,
    pid: int | None = None,
    pid_file: Path | None = None,
    name: str | None = None,
) -> evidence.BundleResult:
    """`wedgewatch capture`: one manual bundle of a server found by URL, pid or pid file.

    With a URL the server's /metrics body is saved too (a failed scrape is noted in the
    bundle, never fatal) and its processes are found from the listening port unless a
    pid or pid file is given.
    """
    body: bytes | None = None
    metrics_error: str | None = None
    metrics_url = metrics_url_of(url) if url is not None else None
    if metrics_url is not None:
        limits = config.scrape_limits()
        async with new_client() as client:
            result = await fetch(
                client,
                metrics_url,
                timeout_seconds=limits.timeout_seconds,
                max_body_bytes=limits.max_body_bytes,
            )
        if isinstance(result, FetchFailed):
            metrics_error = f"{result.reason}: {result.detail}"
        else:
            body = result.body
    else:
        metrics_error = "no URL given (--pid / --pid-file capture)"
    if name is None:
        name = default_target_name(url) if url is not None else f"pid-{pid}" if pid else "server"
    request = evidence.CaptureRequest(
        target=name,
        selector=ProcessSelector(url=url, pid=pid, pid_file=pid_file),
        phase=CapturePhase.MANUAL,
        metrics_body=body,
        metrics_error=metrics_error,
        verdict={"reason": "on-demand capture (wedgewatch capture)"},
    )
    deps = evidence.EvidenceDeps(settings=evidence_settings(config))
    return await evidence.capture_bundle(request, deps)
