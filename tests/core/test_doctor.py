"""The doctor's judgement: which cures and captures will work, and the fix for each."""

from __future__ import annotations

from dataclasses import replace

import pytest

from wedgewatch.core.restart.doctor import (
    CAP_SYS_PTRACE,
    Finding,
    HostFacts,
    Plan,
    Probe,
    TargetFacts,
    exit_code,
    judge,
    ptrace_rights,
    render,
)

ROOT = HostFacts(euid=0, effective_caps=1 << CAP_SYS_PTRACE, ptrace_scope=1, pyspy="/bin/py-spy")
USER = HostFacts(euid=1000, effective_caps=0, ptrace_scope=1, pyspy="/bin/py-spy")
SERVER = TargetFacts(
    name="vllm",
    url="http://127.0.0.1:8000",
    server_pid=42,
    server_uid=1000,
    attach=Probe(True, ""),
    signal=Probe(True, "may signal the server's process group 42"),
    dev_routes="on",
    dev_routes_detail="/openapi.json lists /abort_requests",
    listen_addresses=("127.0.0.1",),
)
ABORT = Plan(remedy="signal", abort_first=True)


def of(findings: list[Finding], check: str) -> Finding:
    (found,) = [f for f in findings if f.check == check]
    return found


def test_everything_in_place_is_all_ok_and_exit_0() -> None:
    """Root, py-spy, a signal right and the dev routes on loopback: every check passes."""
    findings = judge(ABORT, ROOT, [SERVER])
    assert {f.status for f in findings} == {"ok"}
    assert exit_code(findings) == 0
    assert render(findings)[-1] == "everything the configuration relies on can work"


@pytest.mark.parametrize("host", [ROOT, USER], ids=["root", "user"])
def test_ptrace_scope_3_fails_for_everyone_and_says_only_a_reboot_helps(host: HostFacts) -> None:
    """Scope 3 forbids every attach, even root's; the fix names sysctl.d and a reboot."""
    finding = ptrace_rights(replace(host, ptrace_scope=3), same_uid=True, ancestor=True)
    assert finding.status == "fail"
    assert "ptrace_scope = 3" in finding.message
    assert "reboot" in finding.fix


@pytest.mark.parametrize(
    ("scope", "caps", "ancestor", "status"),
    [
        (0, 0, False, "ok"),
        (1, 0, False, "fail"),
        (1, 0, True, "ok"),
        (1, 1 << CAP_SYS_PTRACE, False, "ok"),
        (2, 0, True, "fail"),
        (2, 1 << CAP_SYS_PTRACE, False, "ok"),
        (None, 0, False, "ok"),
    ],
)
def test_ptrace_scope_meanings(scope: int | None, caps: int, ancestor: bool, status: str) -> None:
    """0 same user, 1 descendants or CAP_SYS_PTRACE, 2 CAP_SYS_PTRACE only, no Yama: classic."""
    host = HostFacts(euid=1000, effective_caps=caps, ptrace_scope=scope, pyspy="py-spy")
    assert ptrace_rights(host, same_uid=True, ancestor=ancestor).status == status


def test_another_users_server_needs_cap_sys_ptrace() -> None:
    """Without CAP_SYS_PTRACE a server of another uid cannot be attached, whatever the scope."""
    host = replace(USER, ptrace_scope=0)
    finding = ptrace_rights(host, same_uid=False, ancestor=False)
    assert finding.status == "fail"
    assert "CAP_SYS_PTRACE" in finding.fix


def test_a_missing_py_spy_fails_with_how_to_install_it() -> None:
    """No py-spy: no stacks in the evidence; exit 1 and the fix says how to install it."""
    findings = judge(ABORT, replace(ROOT, pyspy=None), [replace(SERVER, attach=None)])
    assert of(findings, "py-spy").status == "fail"
    assert "pip install py-spy" in of(findings, "py-spy").fix
    assert exit_code(findings) == 1


def test_a_denied_attach_fails_with_the_ptrace_fix() -> None:
    """py-spy found but refused: the attach fails and carries the ptrace fix."""
    denied = replace(SERVER, attach=Probe(False, "Permission denied (os error 13)"))
    findings = judge(ABORT, USER, [denied])
    attach = of(findings, "py-spy attach")
    assert attach.status == "fail"
    assert "Permission denied" in attach.message
    assert "CAP_SYS_PTRACE" in attach.fix


def test_abort_first_without_the_dev_routes_fails_and_names_dev_mode() -> None:
    """abort_first on a server without /abort_requests: the cure cannot work; exit 1."""
    findings = judge(ABORT, ROOT, [replace(SERVER, dev_routes="off")])
    abort = of(findings, "abort")
    assert abort.status == "fail"
    assert "VLLM_SERVER_DEV_MODE=1" in abort.fix
    assert exit_code(findings) == 1


def test_abort_first_on_an_unreachable_server_cannot_be_told_and_fails() -> None:
    """Whether the abort would work is unknown: that is a failure, not a pass."""
    findings = judge(ABORT, ROOT, [replace(SERVER, dev_routes="unknown")])
    assert of(findings, "abort").status == "fail"


def test_dev_routes_beyond_loopback_warn_with_the_way_to_hide_them() -> None:
    """Dev routes on 0.0.0.0: a warning naming /collective_rpc and the proxy fix; exit 0."""
    exposed = replace(SERVER, listen_addresses=("0.0.0.0",))
    findings = judge(ABORT, ROOT, [exposed])
    exposure = of(findings, "exposure")
    assert exposure.status == "warn"
    assert "/collective_rpc" in exposure.message
    assert "/v1/" in exposure.fix
    assert exit_code(findings) == 0


def test_dev_routes_on_loopback_or_off_never_warn_of_exposure() -> None:
    """On 127.0.0.1, or with dev mode off, there is no exposure finding."""
    for target in (SERVER, replace(SERVER, dev_routes="off", listen_addresses=("0.0.0.0",))):
        assert not [f for f in judge(Plan(remedy="none"), ROOT, [target]) if f.check == "exposure"]


def test_an_unlisted_listener_falls_back_to_the_url() -> None:
    """Unknown listen addresses: a non-loopback URL counts as exposed."""
    remote = replace(SERVER, listen_addresses=(), url_is_loopback=False)
    assert remote.beyond_loopback
    assert not replace(remote, url_is_loopback=True).beyond_loopback


@pytest.mark.parametrize(
    ("plan", "target"),
    [
        (Plan(remedy="signal"), replace(SERVER, signal=Probe(False, "not allowed"))),
        (Plan(remedy="exec", exec_command=("/nope",)), replace(SERVER, remedy=Probe(False, "x"))),
        (Plan(remedy="systemd"), replace(SERVER, remedy=Probe(False, "LoadState=not-found"))),
    ],
    ids=["signal", "exec", "systemd"],
)
def test_a_remedy_that_cannot_act_fails(plan: Plan, target: TargetFacts) -> None:
    """A restart that cannot happen (signal denied, command or unit missing): exit 1 + fix."""
    findings = judge(plan, ROOT, [target])
    remedy = of(findings, "remedy")
    assert remedy.status == "fail"
    assert remedy.fix
    assert exit_code(findings) == 1


def test_render_puts_each_fix_under_its_finding() -> None:
    """The human output: a FAIL line, its fix indented below, and the closing count."""
    lines = render(judge(ABORT, ROOT, [replace(SERVER, dev_routes="off")]))
    index = next(i for i, line in enumerate(lines) if line.startswith("FAIL abort"))
    assert lines[index + 1].startswith("     fix: start the server with VLLM_SERVER_DEV_MODE=1")
    assert lines[-1].startswith("1 check(s) failed")


def test_a_process_not_proven_the_server_is_not_attached_and_warns() -> None:
    """A listener that is not proven vLLM is never py-spied: a warning, not a ptrace failure."""
    refused = replace(SERVER, attach=Probe(False, "no VLLM::EngineCore below pid 42", refused=True))
    attach = of(judge(ABORT, ROOT, [refused]), "py-spy attach")
    assert attach.status == "warn"
    assert "pid_file" in attach.fix
