"""A process's kernel-side state, as /proc tells it, and what it means for a stack dump. Pure.

py-spy cannot dump a process that is stopped (`T`: SIGSTOP, or a debugger's group stop),
exited but not reaped (`Z`), or gone, and may hang on one in uninterruptible sleep (`D`).
When that happens the bundle must say why in words, from `/proc/PID/stat` (the state
letter), `/proc/PID/status` (a SIGSTOP still pending: on a busy machine the stop shows as
`T` only once the process next runs), `/proc/PID/wchan` (the kernel function it sleeps
in) and `/proc/PID/stack` (its kernel stack; root only). `io/procs.read_proc_state` reads
them; this module parses and names them.
"""

from __future__ import annotations

from wedgewatch.core.values import immutable

_SIGSTOP_BIT = 1 << (19 - 1)  # SIGSTOP is 19 on Linux, the only system with /proc

#: /proc state letters (proc(5)) and the word the bundle uses for each.
STATE_WORDS = {
    "R": "running",
    "S": "sleeping",
    "D": "uninterruptible sleep (disk or device wait)",
    "T": "stopped (SIGSTOP or a debugger)",
    "t": "stopped by a tracer (tracing stop)",
    "Z": "zombie (exited, not reaped by its parent)",
    "X": "dead",
    "x": "dead",
    "I": "idle kernel thread",
    "P": "parked",
    "W": "paging",
    "K": "wakekill",
}
#: Letters under which py-spy cannot dump, or must not ptrace the process.
_NOT_DUMPABLE = frozenset({"T", "t", "Z", "X", "x"})


def parse_stat_state(stat: str) -> str | None:
    """The state letter in `/proc/<pid>/stat`, after the comm (which may hold spaces)."""
    _, sep, rest = stat.rpartition(")")
    if not sep:
        return None
    fields = rest.split()
    return fields[0] if fields else None


def sigstop_pending(status: str) -> bool:
    """Whether `/proc/<pid>/status` shows a SIGSTOP sent but not yet taken (its ShdPnd mask)."""
    for line in status.splitlines():
        if line.startswith("ShdPnd:"):
            try:
                return bool(int(line.split(":", 1)[1].strip(), 16) & _SIGSTOP_BIT)
            except ValueError:
                return False
    return False


def parse_kernel_stack(text: str, limit: int = 16) -> tuple[str, ...]:
    """`/proc/<pid>/stack` lines (`[<0>] do_signal_stop+0x...`) as names, innermost first."""
    out: list[str] = []
    for line in text.splitlines():
        word = line.split("]", 1)[-1].strip()
        if word:
            out.append(word.split("+", 1)[0])
        if len(out) >= limit:
            break
    return tuple(out)


@immutable
class ProcState:
    """What /proc says of one process; `state` None when the process is gone."""

    pid: int
    state: str | None
    stop_pending: bool = False
    stopped_threads: int = 0  # threads in `T`/`t` (a debugger may stop only some)
    threads: int = 0
    wchan: str | None = None
    kernel_stack: tuple[str, ...] = ()
    kernel_stack_error: str | None = None

    @property
    def gone(self) -> bool:
        """The process no longer exists."""
        return self.state is None

    @property
    def stopped(self) -> bool:
        """Stopped (`T`/`t`), or a SIGSTOP is on its way, or some of its threads are stopped."""
        return self.state in ("T", "t") or self.stop_pending or self.stopped_threads > 0

    @property
    def dead(self) -> bool:
        """Gone, a zombie, or dead: it will never answer again."""
        return self.state is None or self.state in ("Z", "X", "x")

    @property
    def dumpable(self) -> bool:
        """Whether a blocking py-spy dump (ptrace attach) may be tried on it."""
        return not (self.state in _NOT_DUMPABLE or self.gone or self.stopped)

    @property
    def word(self) -> str:
        """`stopped`, `zombie`, `gone`, ... : the status word triage matches on."""
        if self.gone:
            return "gone"
        if self.state in ("Z",):
            return "zombie"
        if self.state in ("X", "x"):
            return "dead"
        if self.stopped:
            return "tracing-stop" if self.state == "t" else "stopped"
        if self.state == "D":
            return "disk-sleep"
        return "running" if self.state == "R" else "sleeping"

    def describe(self) -> str:
        """One sentence: `state T: stopped (SIGSTOP or a debugger); wchan do_signal_stop`."""
        if self.state is None:
            return f"process {self.pid} is gone (no /proc/{self.pid})"
        if self.stop_pending and self.state not in ("T", "t"):
            what = f"state {self.state} with a SIGSTOP pending: stopping (SIGSTOP sent)"
        else:
            what = f"state {self.state}: {STATE_WORDS.get(self.state, 'unknown state')}"
        if self.stopped_threads and self.state not in ("T", "t"):
            what += f"; {self.stopped_threads} of {self.threads} threads stopped"
        if self.wchan:
            what += f"; waiting in kernel {self.wchan}"
        return what

    def to_json(self) -> dict[str, object]:
        """JSON-safe form."""
        return {
            "pid": self.pid,
            "state": self.state,
            "word": self.word,
            "description": self.describe(),
            "stop_pending": self.stop_pending,
            "stopped_threads": self.stopped_threads,
            "threads": self.threads,
            "wchan": self.wchan,
            "kernel_stack": list(self.kernel_stack),
            "kernel_stack_error": self.kernel_stack_error,
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> ProcState:
        """Back from `to_json` (fixtures, bundles); unknown or wrong-typed fields are dropped."""

        def num(key: str) -> int:
            value = data.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) else 0

        state, wchan, err = data.get("state"), data.get("wchan"), data.get("kernel_stack_error")
        stack = data.get("kernel_stack")
        return cls(
            pid=num("pid"),
            state=state if isinstance(state, str) else None,
            stop_pending=data.get("stop_pending") is True,
            stopped_threads=num("stopped_threads"),
            threads=num("threads"),
            wchan=wchan if isinstance(wchan, str) else None,
            kernel_stack=tuple(s for s in stack if isinstance(s, str))
            if isinstance(stack, list)
            else (),
            kernel_stack_error=err if isinstance(err, str) else None,
        )
