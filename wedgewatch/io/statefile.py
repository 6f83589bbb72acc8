"""Atomic JSON persistence of what must survive a wedgewatch restart.

One file, `<state_dir>/state.json`, holds per target the restart state (the restart policy
in wall-clock form and the liveness probe's served failures, through `core.restart_codec`,
the one codec `wedgewatch check --state-file` uses too), the open wedge episodes with their
bundle paths, and the detector's state as an opaque JSON object. Rules:

* **Atomic.** `write_atomic` writes a temporary file in the same directory, fsyncs it,
  renames it over the old file and fsyncs the directory: a reader (or a wedgewatch started
  after a `kill -9` or a power cut) sees the old file or the new one, never a torn mix.
  Temporary files left by a killed writer are removed by the next `load`.
* **Private.** The directory is created 0700 and the file is written 0600.
* **Versioned.** The file carries `schema_version`; a file from a newer wedgewatch is not
  guessed at. Version 2 added the restart policy's `healthy_since_timestamp`; version 1
  files are read as they are.
* **Never a crash.** A missing file is a first start (empty state, no problem). A file that
  cannot be read, is not JSON, or does not match the schema is set aside as
  `state.json.corrupt` and reported as `Loaded.problem`; the caller starts empty and its
  next `save` replaces it. A failed save is returned as `SaveFailed`, not raised.
* **One writer.** `lock_state_dir` takes an exclusive `flock` on `<state_dir>/lock`, so a
  second wedgewatch on the same directory (which would restart the same server twice) is
  refused with the holder's pid. The kernel drops the lock when the holder dies. The
  directory must not be writable by other users, and the lock and state files are never
  opened through a symlink nor readable by others (`io.private_paths`).
* **Off the caller's thread.** `StateWriter` runs the saves of a long-lived process (the
  daemon) on one thread of its own: the caller hands over a snapshot and goes on. At most
  one write is in flight, writes happen in the order given, and a snapshot handed over
  while another waits replaces it (the newest wins; the older one's waiters are answered
  by the newer write). Each hand-over returns a future for the write that covers it.
* **Operator resets.** `request_reset` drops a request file that a running daemon picks up
  with `take_reset_requests` on its next tick and applies with `restart_policy.reset`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import math
import os
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeAlias
from urllib.parse import quote, unquote

from wedgewatch import __version__
from wedgewatch.core.episode.episode_store import EpisodeRecord
from wedgewatch.core.restart import restart_codec
from wedgewatch.core.restart.probe_policy import ProbeRecord
from wedgewatch.core.restart.restart_policy import PolicyRecord
from wedgewatch.core.values import immutable
from wedgewatch.io.atomic import remove_leftovers, write_atomic
from wedgewatch.io.private_paths import UnsafePath, open_lock_file, private_dir, read_private

SCHEMA_VERSION = 2
STATE_FILE_NAME = "state.json"
LOCK_FILE_NAME = "lock"
_RESET_PREFIX = "reset-request."
_RESET_ALL = "reset-request-all"


@immutable
class TargetRecord:
    """Everything persisted about one target."""

    restart_policy: PolicyRecord | None = None
    open_episodes: tuple[EpisodeRecord, ...] = ()
    detector: Mapping[str, Any] | None = None  # `detect_state.dump_state` output, opaque here
    probe: ProbeRecord | None = None  # the probe's served failures (`core.restart_codec`)


@immutable
class SavedState:
    """The whole state file: one record per target name."""

    targets: Mapping[str, TargetRecord] = field(default_factory=dict)
    written_timestamp: float | None = None  # when it was saved (set by `load`)


@immutable
class Loaded:
    """The result of `load`: the state, and what was wrong with the file if anything."""

    state: SavedState
    problem: str | None = None


@immutable
class Saved:
    """`save` wrote `size_bytes` to `path`."""

    path: Path
    size_bytes: int


@immutable
class SaveFailed:
    """`save` could not write the file; the previous file (if any) is intact."""

    message: str


# -- the on-disk schema ------------------------------------------------------------------


# Checked by hand, not with pydantic: the daemon never imports it (docs/daemon.md). Each
# problem is `(where, message)`, `where` the path of keys from the document's top.
_Problems: TypeAlias = list[tuple[tuple[str | int, ...], str]]
_EPISODE_TEXT = ("episode_id", "model_name", "engine", "family")


def _keys(
    document: Mapping[str, Any],
    required: tuple[str, ...],
    optional: tuple[str, ...],
    where: tuple[str | int, ...],
    problems: _Problems,
) -> None:
    """Every key of `document` known, every required one there."""
    problems.extend(((*where, key), "Field required") for key in required if key not in document)
    known = (*required, *optional)
    problems.extend(
        ((*where, key), "Extra inputs are not permitted") for key in document if key not in known
    )


def _finite(value: object, where: tuple[str | int, ...], problems: _Problems) -> None:
    """A finite number (a JSON `true` counts as 1, as it always did)."""
    if isinstance(value, str):
        problems.append(
            (where, "Input should be a valid number, unable to parse string as a number")
        )
    elif not isinstance(value, int | float):
        problems.append((where, "Input should be a valid number"))
    elif not math.isfinite(value):
        problems.append((where, "Input should be a finite number"))


def _episode(value: object, where: tuple[str | int, ...], problems: _Problems) -> None:
    if not isinstance(value, dict):
        problems.append((where, "Input should be a valid dictionary"))
        return
    _keys(value, (*_EPISODE_TEXT, "opened_timestamp"), ("bundle_path",), where, problems)
    for key in _EPISODE_TEXT:
        if key in value and not isinstance(value[key], str):
            problems.append(((*where, key), "Input should be a valid string"))
    if isinstance(value.get("episode_id"), str) and not value["episode_id"]:
        problems.append(((*where, "episode_id"), "String should have at least 1 character"))
    if "opened_timestamp" in value:
        _finite(value["opened_timestamp"], (*where, "opened_timestamp"), problems)
    if value.get("bundle_path") is not None and not isinstance(value["bundle_path"], str):
        problems.append(((*where, "bundle_path"), "Input should be a valid string"))


def _target(value: object, where: tuple[str | int, ...], problems: _Problems) -> None:
    if not isinstance(value, dict):
        problems.append((where, "Input should be a valid dictionary"))
        return
    before = len(problems)
    _keys(value, (), ("restart_policy", "open_episodes", "detector", "probe"), where, problems)
    for key in ("restart_policy", "open_episodes", "detector", "probe"):  # the file's order
        item = value.get(key)
        if key == "open_episodes":
            if key in value and not isinstance(item, list):
                problems.append(((*where, key), "Input should be a valid list"))
            for index, episode in enumerate(item if isinstance(item, list) else ()):
                _episode(episode, (*where, key, index), problems)
        elif item is not None and not isinstance(item, dict):
            problems.append(((*where, key), "Input should be a valid dictionary"))
    if len(problems) == before:  # the restart state, once its parts are of the right types
        decoded = restart_codec.decode(value.get("restart_policy"), value.get("probe"))
        if isinstance(decoded, str):
            problems.append((where, decoded))


def _problems(document: Mapping[str, Any]) -> _Problems:
    """What is wrong with a state file's document (its schema_version already read)."""
    problems: _Problems = []
    required = ("schema_version", "written_timestamp", "wedgewatch_version", "targets")
    _keys(document, required, (), (), problems)
    if document.get("schema_version") not in (None, 1, 2):
        problems.append((("schema_version",), "Input should be 1 or 2"))
    if "written_timestamp" in document:
        _finite(document["written_timestamp"], ("written_timestamp",), problems)
    if "wedgewatch_version" in document and not isinstance(document["wedgewatch_version"], str):
        problems.append((("wedgewatch_version",), "Input should be a valid string"))
    targets = document.get("targets", {})
    if isinstance(targets, dict):
        for name, target in targets.items():
            _target(target, ("targets", name), problems)
    else:
        problems.append((("targets",), "Input should be a valid dictionary"))
    return problems


def _to_state(document: Mapping[str, Any]) -> SavedState:
    """The state of a document without problems."""
    targets: dict[str, TargetRecord] = {}
    for name, target in document["targets"].items():
        restart = restart_codec.decode(target.get("restart_policy"), target.get("probe"))
        assert not isinstance(restart, str)  # noqa: S101 - checked by _problems
        episodes = tuple(
            EpisodeRecord(
                **{key: episode[key] for key in _EPISODE_TEXT},
                opened_timestamp=float(episode["opened_timestamp"]),
                bundle_path=episode.get("bundle_path"),
            )
            for episode in target.get("open_episodes", [])
        )
        targets[name] = TargetRecord(
            restart_policy=restart.policy,
            open_episodes=episodes,
            detector=target.get("detector"),
            probe=restart.probe,
        )
    return SavedState(targets=targets, written_timestamp=float(document["written_timestamp"]))


def encode(state: SavedState, timestamp: float) -> bytes:
    """The file's bytes for `state`, stamped as written at Unix time `timestamp`."""
    targets: dict[str, Any] = {}
    for name in sorted(state.targets):
        record = state.targets[name]
        restart = restart_codec.RestartRecord(record.restart_policy, record.probe)
        targets[name] = {
            **restart_codec.encode(restart),  # restart_policy, probe
            "open_episodes": [dataclasses.asdict(e) for e in record.open_episodes],
            "detector": None if record.detector is None else dict(record.detector),
        }
    document = {
        "schema_version": SCHEMA_VERSION,
        "written_timestamp": timestamp,
        "wedgewatch_version": __version__,
        "targets": targets,
    }
    # allow_nan=False: NaN/Infinity are not JSON and would make the file unreadable to us.
    return (json.dumps(document, indent=1, allow_nan=False) + "\n").encode()


def _first_errors(problems: _Problems) -> str:
    shown = [
        f"{'.'.join(str(part) for part in where) or '(top level)'}: {message}"
        for where, message in problems[:3]
    ]
    more = len(problems) - len(shown)
    return "; ".join(shown) + (f"; and {more} more" if more > 0 else "")


def decode(data: bytes) -> SavedState | str:
    """Parse the file's bytes; a string says what is wrong with them."""
    try:
        document = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return f"is not UTF-8 text ({exc.reason} at byte {exc.start})"
    except json.JSONDecodeError as exc:
        return f"is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    if not isinstance(document, dict):
        return f"holds a JSON {type(document).__name__}, not an object"
    version = document.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        return "has no integer schema_version (not a wedgewatch state file?)"
    if version > SCHEMA_VERSION:
        return (
            f"was written by a newer wedgewatch (schema_version {version}; this one reads "
            f"{SCHEMA_VERSION})"
        )
    problems = _problems(document)
    if problems:
        return f"does not match schema_version {version}: {_first_errors(problems)}"
    return _to_state(document)


# -- files -----------------------------------------------------------------------------------


def state_path(state_dir: Path) -> Path:
    """Where the state file of `state_dir` lives."""
    return state_dir / STATE_FILE_NAME


def load(path: Path) -> Loaded:
    """Read the state file; never raises for a missing, unreadable or corrupt file."""
    remove_leftovers(path)
    try:
        data = read_private(path)  # never through a symlink, never another user's file
    except FileNotFoundError:
        return Loaded(SavedState())
    except OSError as exc:
        what: str = f"cannot be read ({exc.strerror or exc})"
    else:
        decoded = decode(data)
        if isinstance(decoded, SavedState):
            return Loaded(decoded)
        what = decoded
    aside = path.with_name(path.name + ".corrupt")
    try:
        if aside.is_dir() and not aside.is_symlink():
            raise IsADirectoryError(f"{aside} is a directory")
        os.replace(path, aside)
    except OSError as exc:
        kept = f"could not be set aside ({exc}); it will be overwritten"
    else:
        kept = f"was set aside as {aside}"
    return Loaded(
        SavedState(), f"state file {path} {what}; it {kept}; starting with an empty state"
    )


def save(path: Path, state: SavedState, timestamp: float) -> Saved | SaveFailed:
    """Write `state` atomically; a failure is returned, the old file stays intact."""
    try:
        data = encode(state, timestamp)
    except ValueError as exc:  # a NaN or infinity slipped into the state: a bug upstream
        return SaveFailed(f"state for {path} cannot be encoded as JSON: {exc}")
    try:
        write_atomic(path, data, make_parents=True)
    except OSError as exc:
        return SaveFailed(f"cannot write state file {path}: {exc.strerror or exc}")
    return Saved(path, len(data))


# -- the writer thread -----------------------------------------------------------------------

SaveResult: TypeAlias = Saved | SaveFailed


@dataclass(slots=True)
class _Pending:
    state: SavedState
    timestamp: float
    waiters: list[Future[SaveResult]]


class StateWriter:
    """Saves handed-over snapshots on one thread of its own; the newest pending one wins.

    `submit` never waits for a disk: it replaces the snapshot waiting to be written (if
    any) and returns a future that resolves with the result of the write that covers it
    (its own, or a newer one's). `save` is called on the writer thread only, one call at
    a time, in submission order; a `SaveFailed` (or an exception, turned into one) goes to
    `on_failed` on that thread and is every waiter's result. The thread starts with the
    first submission; `close` writes what is pending and stops it (a later `submit` starts
    a new one).
    """

    def __init__(
        self,
        save: Callable[[SavedState, float], SaveResult],
        on_failed: Callable[[SaveFailed], None],
        *,
        name: str = "wedgewatch-state-writer",
    ) -> None:
        self._save = save
        self._on_failed = on_failed
        self._name = name
        self._cond = threading.Condition()
        self._pending: _Pending | None = None
        self._closing = False
        self._thread: threading.Thread | None = None
        self.writes = 0  # saves finished (a failure counts)
        self.coalesced = 0  # snapshots replaced by a newer one before they were written

    def submit(self, state: SavedState, timestamp: float) -> Future[SaveResult]:
        """Hand over a snapshot to write; returns at once."""
        future: Future[SaveResult] = Future()
        with self._cond:
            waiters = [future]
            if self._pending is not None:
                self.coalesced += 1
                waiters[:0] = self._pending.waiters
            self._pending = _Pending(state, timestamp, waiters)
            if self._thread is None:
                self._closing = False
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()
        return future

    def close(self, timeout_seconds: float | None = None) -> bool:
        """Write the pending snapshot, then stop the thread; False if it is still writing."""
        with self._cond:
            thread = self._thread
            self._closing = True
            self._cond.notify()
        if thread is None:
            return True
        thread.join(timeout_seconds)
        if thread.is_alive():
            return False
        with self._cond:
            if self._thread is thread:
                self._thread = None
        return True

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._closing:
                    self._cond.wait()
                pending, self._pending = self._pending, None
                if pending is None:  # closing, and nothing left to write
                    if self._thread is threading.current_thread():
                        self._thread = None
                    return
            try:
                result = self._save(pending.state, pending.timestamp)
            except Exception as exc:  # a bug in a store must not kill the writer
                result = SaveFailed(f"saving the state raised {type(exc).__name__}: {exc}")
            if isinstance(result, SaveFailed):
                self._on_failed(result)
            self.writes += 1
            for waiter in pending.waiters:
                with contextlib.suppress(InvalidStateError):  # a waiter that was cancelled
                    waiter.set_result(result)


# -- one writer --------------------------------------------------------------------------------


class StateLock:
    """An exclusive lock on a state directory, held until `release` or process exit."""

    def __init__(self, path: Path, fd: int, note: str | None = None) -> None:
        self.path = path
        self._fd: int | None = fd
        self.note = note  # the state directory's mode was tightened (`private_dir`)

    def release(self) -> None:
        """Drop the lock (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None


@immutable
class LockFailed:
    """The state directory is in use (`holder` is that process's pid), or unusable."""

    message: str
    holder: str | None = None


def lock_state_dir(state_dir: Path) -> StateLock | LockFailed:
    """Take the exclusive lock of `state_dir` for this process.

    The directory is created 0700 if missing, else checked (`io.private_paths`: not
    writable by other users); the lock file is opened 0600 without following a symlink.
    """
    path = state_dir / LOCK_FILE_NAME
    try:
        note = private_dir(state_dir, "state_dir")
        fd = open_lock_file(path)
    except UnsafePath as exc:
        return LockFailed(f"refusing state_dir: {exc}")
    except OSError as exc:
        return LockFailed(f"cannot open lock file {path}: {exc.strerror or exc}")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
        finally:
            os.close(fd)
        return LockFailed(
            f"state_dir {state_dir} is in use by another wedgewatch (pid {holder}); two "
            "watchdogs on one server would restart it twice. Stop the other one or give "
            "this one its own state_dir",
            holder=holder,
        )
    except OSError as exc:
        os.close(fd)
        return LockFailed(f"cannot lock {path}: {exc.strerror or exc}")
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return StateLock(path, fd, note)


# -- operator resets -------------------------------------------------------------------------


@immutable
class ResetRequests:
    """Restart-budget resets an operator asked for since the last look."""

    everything: bool = False
    targets: frozenset[str] = frozenset()

    def covers(self, target: str) -> bool:
        """Whether `target`'s budget is to be reset."""
        return self.everything or target in self.targets


def request_reset(state_dir: Path, target: str | None = None) -> Path:
    """Ask a running daemon to reset the restart budget of `target` (None: every target)."""
    name = _RESET_ALL if target is None else _RESET_PREFIX + quote(target, safe="")
    path = state_dir / name
    write_atomic(path, b"reset\n", make_parents=True)
    return path


def take_reset_requests(state_dir: Path) -> ResetRequests:
    """Collect and delete pending reset requests (an unreadable directory yields none)."""
    everything = False
    targets: set[str] = set()
    try:
        with os.scandir(state_dir) as entries:
            names = [entry.name for entry in entries]
    except OSError:
        return ResetRequests()
    for name in names:
        if name == _RESET_ALL:
            hit = True
        elif name.startswith(_RESET_PREFIX):
            hit = False
            targets.add(unquote(name[len(_RESET_PREFIX) :]))
        else:
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(state_dir / name)
        everything = everything or hit
    return ResetRequests(everything=everything, targets=frozenset(targets))


@immutable
class ResetDone:
    """What `reset_restarts` did: `applied` to the file now, or requested from the daemon."""

    applied: bool
    message: str


@immutable
class ResetFailed:
    """`reset_restarts` could neither apply nor request the reset."""

    message: str


def reset_restarts(
    state_dir: Path, target: str | None, timestamp: float
) -> ResetDone | ResetFailed:
    """Reset the restart budget (and leave gave_up) of `target`, or of every target if None.

    With a wedgewatch running on `state_dir` (it holds the lock) a reset request is left
    for it to apply on its next tick; otherwise the state file is edited directly.
    """
    scope = "every target" if target is None else f"target {target!r}"
    lock = lock_state_dir(state_dir)
    if isinstance(lock, LockFailed):
        if lock.holder is None:
            return ResetFailed(lock.message)
        try:
            request_reset(state_dir, target)
        except OSError as exc:
            return ResetFailed(f"cannot leave a reset request in {state_dir}: {exc}")
        return ResetDone(
            False,
            f"asked the running wedgewatch (pid {lock.holder}) to reset the restart budget "
            f"of {scope}; it applies the request on its next tick",
        )
    try:
        path = state_path(state_dir)
        loaded = load(path)
        targets = dict(loaded.state.targets)
        chosen = list(targets) if target is None else [target]
        if target is not None and target not in targets:
            known = ", ".join(sorted(targets)) or "none"
            return ResetDone(
                True, f"no restart history for {scope} in {path} (targets with state: {known})"
            )
        for name in chosen:
            targets[name] = replace(targets[name], restart_policy=None)
        saved = save(path, replace(loaded.state, targets=targets), timestamp)
        if isinstance(saved, SaveFailed):
            return ResetFailed(saved.message)
        note = f" ({loaded.problem})" if loaded.problem else ""
        return ResetDone(
            True, f"reset the restart budget of {scope} in {path}; no wedgewatch was running{note}"
        )
    finally:
        lock.release()
