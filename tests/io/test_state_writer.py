"""The state writer thread: the newest pending snapshot wins, one write at a time, in order,
failures as data, and `close` writes what is pending. Real files, real threads; the only
stand-in is a gate that holds a save until the test opens it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

from wedgewatch.io import statefile
from wedgewatch.io.statefile import Saved, SavedState, SaveFailed, StateWriter, TargetRecord

# A bound on waits for another thread, so that a broken writer fails the test instead of
# hanging it; no assertion depends on how long anything takes.
SAFETY_SECONDS = 30.0


def state(name: str) -> SavedState:
    """A snapshot that says which one it is (its only target's name)."""
    return SavedState(targets={name: TargetRecord()})


class GatedFile:
    """statefile.save to a real file; a save waits at the gate while it is closed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.gate = threading.Event()
        self.gate.set()
        self.waiting = threading.Event()  # a save is held at the closed gate
        self.written: list[float] = []  # timestamps, in the order the saves finished
        self.active = 0
        self.most_active = 0
        self._lock = threading.Lock()

    def save(self, snapshot: SavedState, timestamp: float) -> statefile.SaveResult:
        with self._lock:
            self.active += 1
            self.most_active = max(self.most_active, self.active)
        try:
            if not self.gate.is_set():
                self.waiting.set()
                assert self.gate.wait(SAFETY_SECONDS)
                self.waiting.clear()
            result = statefile.save(self.path, snapshot, timestamp)
            self.written.append(timestamp)
            return result
        finally:
            with self._lock:
                self.active -= 1


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[GatedFile]:
    gated = GatedFile(tmp_path / "state" / statefile.STATE_FILE_NAME)
    yield gated
    gated.gate.set()  # never leave a writer thread stuck behind a failed test


def on_disk(disk: GatedFile) -> set[str]:
    loaded = statefile.load(disk.path)
    assert loaded.problem is None
    return set(loaded.state.targets)


def test_the_newest_pending_snapshot_wins_and_answers_every_waiter(disk: GatedFile) -> None:
    """While one write hangs, three hand-overs coalesce into one write: the newest."""
    failures: list[SaveFailed] = []
    writer = StateWriter(disk.save, failures.append)
    disk.gate.clear()
    first = writer.submit(state("first"), 1.0)
    assert disk.waiting.wait(SAFETY_SECONDS)
    later = [writer.submit(state(name), t) for name, t in (("a", 2.0), ("b", 3.0), ("c", 4.0))]
    assert not first.done()
    assert not any(f.done() for f in later)  # nothing waits for a disk but the writer
    disk.gate.set()
    newest = later[-1].result(SAFETY_SECONDS)
    assert isinstance(newest, Saved)
    assert first.result(SAFETY_SECONDS) is not newest
    assert all(f.result(SAFETY_SECONDS) is newest for f in later)  # covered by the newest write
    assert disk.written == [1.0, 4.0]  # "a" and "b" were replaced, never written
    assert writer.coalesced == 2
    assert on_disk(disk) == {"c"}
    assert failures == []
    assert writer.close(SAFETY_SECONDS)


def test_writes_never_overlap_and_keep_the_order_given(disk: GatedFile) -> None:
    """Hand-overs from four threads: one write at a time, in the order handed over, the
    last one written."""
    writer = StateWriter(disk.save, lambda failed: None)
    handed: list[tuple[float, Future[statefile.SaveResult]]] = []
    lock = threading.Lock()

    def hand_over(thread: int) -> None:
        for i in range(40):
            timestamp = thread * 1000.0 + i
            with lock:  # the list's order is the order of the hand-overs
                handed.append((timestamp, writer.submit(state(f"t{thread}"), timestamp)))

    threads = [threading.Thread(target=hand_over, args=(n,)) for n in range(1, 5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for _, future in handed:
        assert isinstance(future.result(SAFETY_SECONDS), Saved)
    assert disk.most_active == 1
    order = [timestamp for timestamp, _ in handed]
    positions = [order.index(t) for t in disk.written]
    assert positions == sorted(positions)  # written in the order handed over
    assert disk.written[-1] == order[-1]  # the newest always lands
    assert len(disk.written) + writer.coalesced == len(order)
    assert writer.close(SAFETY_SECONDS)


def test_a_failed_save_is_data_for_the_log_and_the_waiters(tmp_path: Path) -> None:
    """A save that fails (or raises) goes to on_failed and to its waiters; the writer goes on."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("x")
    failures: list[SaveFailed] = []
    path = blocker / statefile.STATE_FILE_NAME
    writer = StateWriter(lambda s, t: statefile.save(path, s, t), failures.append)
    result = writer.submit(state("a"), 1.0).result(SAFETY_SECONDS)
    assert isinstance(result, SaveFailed)
    assert "cannot write state file" in result.message
    assert failures == [result]
    assert writer.close(SAFETY_SECONDS)

    calls: list[str] = []

    def flaky(snapshot: SavedState, timestamp: float) -> statefile.SaveResult:
        calls.append(next(iter(snapshot.targets)))
        if len(calls) == 1:
            raise RuntimeError("a bug in a store")
        return statefile.save(tmp_path / "ok.json", snapshot, timestamp)

    failures.clear()
    writer = StateWriter(flaky, failures.append)
    raised = writer.submit(state("a"), 1.0).result(SAFETY_SECONDS)
    assert isinstance(raised, SaveFailed)
    assert raised.message == "saving the state raised RuntimeError: a bug in a store"
    assert failures == [raised]
    assert isinstance(writer.submit(state("b"), 2.0).result(SAFETY_SECONDS), Saved)
    assert calls == ["a", "b"]
    assert writer.close(SAFETY_SECONDS)


def test_close_writes_the_pending_snapshot_then_stops_the_thread(disk: GatedFile) -> None:
    """close waits for the write in flight and the newest pending one; a later submit
    starts the thread again."""
    writer = StateWriter(disk.save, lambda failed: None, name="writer-under-test")
    disk.gate.clear()
    writer.submit(state("first"), 1.0)
    assert disk.waiting.wait(SAFETY_SECONDS)
    writer.submit(state("last"), 2.0)
    assert not writer.close(0.0)  # still writing: it says so instead of waiting
    closed: list[bool] = []
    closer = threading.Thread(target=lambda: closed.append(writer.close(SAFETY_SECONDS)))
    closer.start()
    disk.gate.set()
    closer.join(SAFETY_SECONDS)
    assert closed == [True]
    assert disk.written == [1.0, 2.0]
    assert on_disk(disk) == {"last"}
    assert "writer-under-test" not in {t.name for t in threading.enumerate()}
    assert isinstance(writer.submit(state("again"), 3.0).result(SAFETY_SECONDS), Saved)
    assert on_disk(disk) == {"again"}
    assert writer.close(SAFETY_SECONDS)
    assert "writer-under-test" not in {t.name for t in threading.enumerate()}


def test_closing_an_unused_writer_starts_nothing() -> None:
    writer = StateWriter(lambda s, t: SaveFailed("never called"), lambda failed: None)
    assert writer.close(0.0)
    assert writer.writes == 0
