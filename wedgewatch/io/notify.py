"""Webhook notifications: a JSON POST per event to each configured URL, off the watch loop.

`WebhookNotifier.notify` only puts the notification on a bounded queue per URL and returns
at once; one worker task per URL delivers in order. Rules:

* **Bounded queue.** When a URL's queue is full (its receiver is down or slow), the oldest
  waiting notification is dropped for the newest and counted in `stats.dropped`: the latest
  state is what an operator needs.
* **Bounded retries.** A POST gets `timeout_seconds` for connecting, sending and the
  response. Timeouts, connection errors, 429 and 5xx responses are retried up to `retries`
  times by stamina (`stamina.retry_context`) with jittered exponential backoff: the wait
  before retry k is drawn from [d/2, d] where d = `backoff_seconds` * 2**(k-1) capped at
  `backoff_max_seconds`, so the jitter never makes the retries last longer than the plain
  doubling did (`_backoff`). Other 4xx responses are not retried (the request is wrong and
  would stay wrong). Each failed attempt that will be retried is logged as `webhook_retry`
  (counted in `stats.retried`); a notification that is not delivered is counted in
  `stats.failed`, logged as `webhook_failed` and passed to `on_failure`. Both name the URL
  without its secret (`core.redact.redact_webhook_url`) and scrub it out of the error.
* **Testing.** The waits are stamina's: `stamina.set_testing(True, attempts=N, cap=True)`
  makes them zero while keeping the configured attempt count. stamina's own retry hooks
  (a log line with the exception's repr, a counter on prometheus_client's global
  registry) are replaced by `_log_retry` when a notifier starts.
* **One URL never delays another**, and a receiver that hangs costs at most its timeout
  per attempt.
* **Shutdown.** `aclose(timeout_seconds)` lets the workers deliver what is queued until the
  deadline, then cancels them.

The payload (`payload()`) is a flat JSON object: `event`, `target`, `engine`,
`model_name`, `family`, `state`, `reason`, `bundle` (path or null), `wedgewatch_version`,
`host`, `timestamp` (ISO 8601, UTC) and `text`, a one-line human summary. Every value is
redacted (`core.redact.redact_value`) and neutralised (`core.escape.neutralise`: control
characters visible, one line), and bounded whatever the target said: each value is cut
(with `vllm.signals.truncate`'s marker) at `FIELD_MAX_CHARS`, `text` at `TEXT_MAX_CHARS`, so
a body stays under about 32 KiB. `text` is escaped for Slack (`&`, `<`, `>`), so a model
name cannot mention `<!channel>` or smuggle a link.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import math
import socket
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import structlog

from wedgewatch import __version__
from wedgewatch.core.text.escape import neutralise, slack_text
from wedgewatch.core.text.redact import (
    redact_value,
    redact_webhook_url,
    scrub_text,
    secret_fragments,
)
from wedgewatch.core.values import immutable

if TYPE_CHECKING:  # httpx and stamina are imported when the first webhooks start
    import httpx
    from stamina.instrumentation import RetryDetails

log = structlog.get_logger("wedgewatch.notify")

#: How many notifications wait per URL before the oldest is dropped.
QUEUE_SIZE = 100
#: The longest value of a payload field, and of its `text` (see the module docstring).
FIELD_MAX_CHARS = 2048
TEXT_MAX_CHARS = 4096


@immutable
class Notification:
    """One thing that happened to a target, at Unix time `timestamp`."""

    event: str
    target: str
    engine: str
    model_name: str
    family: str
    state: str
    reason: str
    timestamp: float
    bundle: str | None = None


@immutable
class WebhookFailure:
    """A notification that could not be delivered to `url`."""

    url: str
    event: str
    attempts: int
    message: str


@immutable
class NotifyStats:
    """Counters since the notifier was created (summed over URLs)."""

    sent: int
    failed: int
    dropped: int
    retried: int


def payload(notification: Notification, *, version: str, host: str) -> dict[str, Any]:
    """The JSON object POSTed for `notification`."""
    when = dt.datetime.fromtimestamp(notification.timestamp, tz=dt.UTC)
    engine = f"{notification.model_name} engine {notification.engine}".strip()
    text = f"wedgewatch on {host}: {notification.event} for {notification.target}"
    if notification.engine or notification.model_name:
        text += f" ({engine})"
    if notification.family:
        text += f", {notification.family}"
    if notification.reason:
        text += f": {notification.reason}"
    if notification.bundle:
        text += f" [evidence: {notification.bundle}]"
    body = {
        "event": notification.event,
        "target": notification.target,
        "engine": notification.engine,
        "model_name": notification.model_name,
        "family": notification.family,
        "state": notification.state,
        "reason": notification.reason,
        "bundle": notification.bundle,
        "wedgewatch_version": version,
        "host": host,
        "timestamp": when.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "text": text,
    }
    safe = {
        name: neutralise(
            value, TEXT_MAX_CHARS if name == "text" else FIELD_MAX_CHARS, newlines=False
        )
        if isinstance(value, str)
        else value
        for name, value in redact_value(body).items()
    }
    return {**safe, "text": slack_text(safe["text"])}


def _check_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"webhook URL {_redact(url)!r} must be an http:// or https:// URL with a host"
        )
    return url


def _redact(url: str) -> str:
    """The URL without its path, query and credentials: webhook URLs carry their secret in
    the path (Slack, Discord, Teams) or the query."""
    return redact_webhook_url(url)


class _Failed(Exception):
    """An attempt failed; `message` is scrubbed of the URL's secret, `url` is redacted."""

    def __init__(self, message: str, url: str, notification: Notification) -> None:
        super().__init__(message)
        self.message = message
        self.url = url
        self.notification = notification


class _Retry(_Failed):
    """An attempt failed in a way that may pass on retry."""


class _GiveUp(_Failed):
    """An attempt failed in a way that will not pass on retry."""


def _backoff(initial: float, maximum: float) -> dict[str, float]:
    """stamina's wait arguments for waits in [d/2, d], d = `initial` * 2**(k-1) capped at
    `maximum` (k = 1 before the first retry): stamina waits min(wait_max, wait_initial *
    2**(k-1) + uniform(0, wait_jitter)), and half of `initial` doubled plus at most half of
    `initial` never exceeds `initial` doubled."""
    return {"wait_initial": initial / 2, "wait_jitter": initial / 2, "wait_max": maximum}


def _log_retry(details: RetryDetails) -> None:
    """stamina's on-retry hook: one `webhook_retry` line per failed attempt to be retried."""
    failed = details.caused_by
    if not isinstance(failed, _Retry):  # not a webhook: wedgewatch has no other user
        return
    log.warning(
        "webhook_retry",
        url=failed.url,
        notification=failed.notification.event,
        target=failed.notification.target,
        attempt=details.retry_num,
        retry_in_seconds=round(details.wait_for, 4),
        error=failed.message,
    )


class WebhookNotifier:
    """Delivers notifications to webhook URLs from background tasks; never blocks the caller."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        timeout_seconds: float = 5.0,
        retries: int = 3,
        backoff_seconds: float = 1.0,
        backoff_max_seconds: float = 30.0,
        queue_size: int = QUEUE_SIZE,
        version: str = __version__,
        host: str | None = None,
        on_failure: Callable[[WebhookFailure], None] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if not math.isfinite(timeout_seconds) or timeout_seconds <= 0:
            raise ValueError(f"webhook timeout_seconds must be > 0, got {timeout_seconds}")
        if retries < 0:
            raise ValueError(f"webhook retries must be >= 0, got {retries}")
        if queue_size < 1:
            raise ValueError(f"webhook queue_size must be >= 1, got {queue_size}")
        if backoff_seconds < 0 or backoff_max_seconds < backoff_seconds:
            raise ValueError("webhook backoff must satisfy 0 <= backoff_seconds <= backoff_max")
        self.urls = tuple(_check_url(u) for u in urls)
        self._timeout = timeout_seconds
        self._retries = retries
        self._backoff = backoff_seconds
        self._backoff_max = backoff_max_seconds
        self._version = version
        self._host = host if host is not None else socket.gethostname()
        self._on_failure = on_failure
        self._transport = transport
        self._queues: dict[str, asyncio.Queue[Notification]] = {
            url: asyncio.Queue(maxsize=queue_size) for url in self.urls
        }
        self._tasks: list[asyncio.Task[None]] = []
        self._client: httpx.AsyncClient | None = None
        self._sent = self._failed = self._dropped = self._retried = 0

    @property
    def stats(self) -> NotifyStats:
        """Delivery counters."""
        return NotifyStats(self._sent, self._failed, self._dropped, self._retried)

    def start(self) -> None:
        """Start one delivery task per URL; call from inside the running event loop."""
        if self._client is not None:
            return
        import httpx  # noqa: PLC0415 - see TYPE_CHECKING above
        from stamina.instrumentation import set_on_retry_hooks  # noqa: PLC0415 - ditto

        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(self._timeout),
            transport=self._transport,
            follow_redirects=False,
            headers={"user-agent": f"wedgewatch/{self._version}"},
        )
        client = self._client
        set_on_retry_hooks((_log_retry,))  # idempotent; see the module docstring
        for url, queue in self._queues.items():
            task = asyncio.create_task(self._deliver_all(client, url, queue))
            self._tasks.append(task)

    def notify(self, notification: Notification) -> None:
        """Queue `notification` for every URL and return at once (drop the oldest if full)."""
        for url, queue in self._queues.items():
            if queue.full():
                with contextlib.suppress(asyncio.QueueEmpty):
                    dropped = queue.get_nowait()
                    queue.task_done()
                    self._dropped += 1
                    log.warning(
                        "webhook_dropped",
                        url=_redact(url),
                        notification=dropped.event,
                        target=dropped.target,
                        reason="queue full",
                    )
            queue.put_nowait(notification)

    async def aclose(self, timeout_seconds: float = 5.0) -> None:
        """Deliver what is queued until `timeout_seconds` pass, then stop the workers."""
        if self._tasks:
            joins = [asyncio.ensure_future(q.join()) for q in self._queues.values()]
            _, pending = await asyncio.wait(joins, timeout=timeout_seconds)
            for join in pending:
                join.cancel()
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, *pending, return_exceptions=True)
            self._tasks.clear()
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _deliver_all(
        self, client: httpx.AsyncClient, url: str, queue: asyncio.Queue[Notification]
    ) -> None:
        while True:
            notification = await queue.get()
            try:
                await self._deliver(client, url, notification)
            except Exception:  # a bug must not silence every later notification
                log.exception("webhook_worker_error", url=_redact(url))
            finally:
                queue.task_done()

    async def _deliver(
        self, client: httpx.AsyncClient, url: str, notification: Notification
    ) -> None:
        import stamina  # noqa: PLC0415 - see TYPE_CHECKING above

        body = payload(notification, version=self._version, host=self._host)
        attempts = 0
        try:
            async for attempt in stamina.retry_context(
                on=_Retry,
                attempts=self._retries + 1,
                timeout=None,  # bounded by the attempts, each by `timeout_seconds`
                **_backoff(self._backoff, self._backoff_max),
            ):
                with attempt:
                    attempts = attempt.num
                    if attempts > 1:
                        self._retried += 1
                    await self._post(client, url, body, notification)
        except _Failed as failed:
            self._fail(failed, attempts)
        else:
            self._sent += 1

    def _fail(self, failed: _Failed, attempts: int) -> None:
        failure = WebhookFailure(failed.url, failed.notification.event, attempts, failed.message)
        self._failed += 1
        log.warning(
            "webhook_failed",
            url=failure.url,
            notification=failure.event,
            target=failed.notification.target,
            attempts=attempts,
            error=failure.message,
        )
        if self._on_failure is not None:
            self._on_failure(failure)

    async def _post(
        self,
        client: httpx.AsyncClient,
        url: str,
        body: dict[str, Any],
        notification: Notification,
    ) -> None:
        import httpx  # noqa: PLC0415 - see TYPE_CHECKING above

        def failed(kind: type[_Failed], message: str) -> _Failed:
            return kind(scrub_text(message, secret_fragments([url])), _redact(url), notification)

        try:
            async with asyncio.timeout(self._timeout):  # the whole exchange, not per phase
                response = await client.post(url, json=body)
        except (TimeoutError, httpx.TimeoutException) as exc:
            raise failed(_Retry, f"timed out ({type(exc).__name__})") from exc
        except httpx.TransportError as exc:
            raise failed(_Retry, f"{type(exc).__name__}: {exc}") from exc
        status = response.status_code
        if 200 <= status < 300:
            return
        text = f"HTTP {status}"
        if status == 429 or status >= 500:
            raise failed(_Retry, text)
        raise failed(_GiveUp, text + " (not retried)")
