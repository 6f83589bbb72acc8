"""A minimal `Restart=always` supervisor for the real-server tests (what systemd does).

    python restart_always.py same-group|own-group PIDS_FILE LOG_FILE -- COMMAND...

Runs COMMAND, appends its pid to PIDS_FILE, waits for it and runs it again, forever.
`same-group`: the command shares the supervisor's process group (a supervising parent, so a
restarter must signal the server's processes one by one and spare the supervisor);
`own-group`: each start leads its own session and group (as systemd starts a service).
"""

from __future__ import annotations

import subprocess
import sys


def main(argv: list[str]) -> None:
    mode, pids, log, dashes, *command = argv
    if mode not in ("same-group", "own-group") or dashes != "--" or not command:
        raise SystemExit(__doc__)
    while True:
        with open(log, "ab") as out:
            child = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, start_new_session=mode == "own-group"
            )
        with open(pids, "a", encoding="utf-8") as record:
            record.write(f"{child.pid}\n")
        child.wait()


if __name__ == "__main__":
    main(sys.argv[1:])
