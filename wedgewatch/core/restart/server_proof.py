"""Is this the watched server? Pure judgements made before wedgewatch touches a process.

* `is_this_machine`: is a host (its addresses) this machine: loopback or one of its own
  interface addresses? Only then is a process looked up by the target's port.
* `cgroup_in_unit`: does a process run inside a systemd unit (its cgroup)?
* `prove_server`: is a process tree the vLLM server: a `VLLM::EngineCore*` process in it,
  or its root named by the target (`pid`, `pid_file`, its systemd unit), and never
  wedgewatch itself? Signals (and py-spy) need this proof.
"""

from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import Iterable, Sequence

from wedgewatch.core.text.redact import redact_text
from wedgewatch.vllm.semantics import ENGINE_TITLE_PREFIX


def plain_ip(address: str) -> str:
    """An interface address without its IPv6 zone (`fe80::1%eth0` -> `fe80::1`)."""
    return address.split("%", 1)[0]


def is_this_machine(host_ips: Iterable[str], local_ips: Iterable[str]) -> bool:
    """Is a host with these addresses this machine: a loopback address, or one of its own
    interface addresses (`local_ips`)? A host with no known address is not."""
    local = set()
    for address in local_ips:
        with contextlib.suppress(ValueError):
            local.add(ipaddress.ip_address(plain_ip(address)))
    ips = list(host_ips)
    if not ips:
        return False
    for address in ips:
        try:
            ip = ipaddress.ip_address(plain_ip(address))
        except ValueError:
            return False
        if ip.is_loopback or ip in local:
            return True
    return False


def cgroup_in_unit(cgroup_text: str, unit: str) -> bool:
    """Does a `/proc/<pid>/cgroup` text put the process inside systemd unit `unit`?

    systemd runs each service in its own cgroup, `.../<unit>` (cgroup v2 `0::` line, or the
    `name=systemd` hierarchy of v1), possibly with sub-cgroups below it.
    """
    if not unit or "/" in unit:
        return False
    for line in cgroup_text.splitlines():
        _, _, path = line.partition("::") if line.startswith("0::") else line.rpartition(":")
        if unit in path.strip().split("/"):
            return True
    return False


def names_vllm(title: str) -> bool:
    """Does a command line or title name vLLM's server (`vllm serve`, `vllm.entrypoints`,
    `VLLM::...`)?"""
    if title.startswith("VLLM::"):
        return True
    words = title.replace("/", " ").split()
    return "vllm.entrypoints.openai.api_server" in words or ("vllm" in words and "serve" in words)


def prove_server(
    tree: Sequence[tuple[int, str]],
    *,
    explicit: bool,
    own_pids: Iterable[int],
    accept_vllm_command: bool = False,
) -> str | None:
    """None when a process tree (pid, title pairs, root first) is proven to be the watched
    vLLM server; otherwise the reason it is not, for the log and `/status`.

    Proof: it does not contain wedgewatch itself (`own_pids`), and either it contains a
    `VLLM::EngineCore*` process or its root came from the target's explicit `pid`,
    `pid_file` or systemd unit (`explicit`). `accept_vllm_command` (read-only uses such as
    stack dumps) also accepts a root whose command line names vLLM (`vllm serve ...`): an API
    server whose EngineCore died. Signals never do.
    """
    if not tree:
        return "no server process is known"
    root_pid, root_title = tree[0]
    mine = sorted(set(own_pids) & {pid for pid, _ in tree})
    if mine:
        return f"wedgewatch itself (pid {mine[0]}) belongs to the process tree of pid {root_pid}"
    if explicit:
        return None
    if any(title.startswith(ENGINE_TITLE_PREFIX) for _, title in tree):
        return None
    if accept_vllm_command and names_vllm(root_title):
        return None
    # Redacted before it is cut: a cut through `user:password@` would keep half the secret.
    shown = redact_text(root_title)[:80] or "?"
    return (
        f"the process tree of pid {root_pid} ({shown!r}, {len(tree)} process(es)) has no "
        f"{ENGINE_TITLE_PREFIX}* process, so it is not proven to be the vLLM server; if it "
        "is, set the target's pid, pid_file or systemd_unit"
    )
