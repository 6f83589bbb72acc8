"""`--help` as a user reads it: piped (no terminal, COLUMNS unset), every flag name whole,
`launch` splitting its own flags from the watchdog's, `--critical-only` saying what it does."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import typer.main

from wedgewatch.cli import LAUNCHER_PANEL, WATCHDOG_PANEL, mount_commands


def commands() -> list[tuple[list[str], list[str]]]:
    """(command path, every flag name) for every wedgewatch command."""
    found: list[tuple[list[str], list[str]]] = []

    def walk(command: typer.main.click.Command, path: list[str]) -> None:  # type: ignore[name-defined]
        subcommands = getattr(command, "commands", None)
        if subcommands:
            for name, sub in subcommands.items():
                walk(sub, [*path, name])
            return
        flags = [
            name
            for param in command.params
            for name in (*param.opts, *param.secondary_opts)
            if name.startswith("-")
        ]
        found.append((path, flags))

    walk(typer.main.get_command(mount_commands()), [])
    return found


def piped_help(path: list[str]) -> str:
    """`wedgewatch PATH --help` into a pipe, with COLUMNS and TERMINAL_WIDTH unset."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "TERMINAL_WIDTH", "LINES")}
    done = subprocess.run(
        [sys.executable, "-m", "wedgewatch", *path, "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def flat(text: str) -> str:
    """Help text without the panels' box characters, whitespace collapsed."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


COMMANDS = commands()


@pytest.mark.parametrize(
    ("path", "flags"), COMMANDS, ids=[" ".join(p) or "wedgewatch" for p, _ in COMMANDS]
)
def test_piped_help_shows_every_flag_whole(path: list[str], flags: list[str]) -> None:
    """No flag name is cut short ("--stall-after-seco…") when help goes into a pipe."""
    text = piped_help(path)
    assert "…" not in text, [line for line in text.splitlines() if "…" in line]
    words = set(re.findall(r"--?[A-Za-z][\w-]*", text))
    missing = [f for f in flags if f not in words]
    assert missing == [], missing


def test_launch_help_separates_the_launcher_from_the_watchdog() -> None:
    """The launcher's own flags come in their panel, the watchdog's (used with --watch) in
    theirs."""
    text = piped_help(["launch"])
    launcher = text.index(f"─ {LAUNCHER_PANEL} ─")
    watchdog = text.index(f"─ {WATCHDOG_PANEL} ─")
    assert launcher < watchdog
    for own in ("--model", "--profile", "--vllm-bin", "--dry-run", "--watch", "--list-profiles"):
        assert launcher < text.index(f"│ {own} ") < watchdog, own
    for setting in ("--config", "--stall-after-seconds", "--restart-budget", "--evidence-dir"):
        assert text.index(f"│ {setting} ") > watchdog, setting


def test_critical_only_help_says_what_it_does() -> None:
    """As docs/check.md says: WARNING and a judged UNKNOWN exit 0, only CRITICAL fails, and why;
    broken invocations still exit 3."""
    text = flat(piped_help(["check"]))
    start = text.index("--critical-only")
    help_text = text[start : text.index("--interval-seconds", start)]
    for part in ("Exit 0 for WARNING", "judged UNKNOWN", "only CRITICAL (2) fails",
                 "Kubernetes exec probes", "still exit 3"):  # fmt: skip
        assert part in help_text, help_text
