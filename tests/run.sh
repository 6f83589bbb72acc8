#!/usr/bin/env bash
# The whole test suite, from a fresh machine: creates (or reuses) .venv, installs wedgewatch
# with its test tools, installs promtool (Debian's prometheus package) when it is missing,
# then runs the formatter check, the linter, mypy --strict and every test, slow ones included.
# Extra arguments go to pytest (e.g. `bash tests/run.sh -m "not slow"` for a quick pass).
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'

if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        echo "tests/run.sh: installing Debian's prometheus package (promtool, prometheus)" >&2
        apt-get update -q >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q prometheus >/dev/null
    else
        echo "tests/run.sh: promtool is missing; run 'sudo apt-get install -y prometheus'" >&2
        exit 2
    fi
fi

.venv/bin/ruff format --check .
.venv/bin/ruff check .
.venv/bin/mypy
exec .venv/bin/python -m pytest "$@"
