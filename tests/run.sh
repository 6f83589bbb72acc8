#!/usr/bin/env bash
# The whole test suite, from a fresh machine: creates (or reuses) .venv, installs wedgewatch
# with its test tools, installs the real tools the tests use (Debian's prometheus, systemd,
# nodejs and chromium packages) when they are missing, checks that kubectl can render the
# manifests,
# then runs the formatter check, the linter, mypy --strict and every test, slow ones included.
# Extra arguments go to pytest (e.g. `bash tests/run.sh -m "not slow"` for a quick pass).
set -euo pipefail
cd "$(dirname "$0")/.."

need_root() {
    if [ "$(id -u)" != 0 ]; then
        echo "tests/run.sh: $1 is missing; run 'sudo apt-get install -y $2' first" >&2
        exit 2
    fi
}
apt_updated=""
apt_install() {  # apt_install PACKAGE...: Debian packages, `apt-get update` once first
    if [ -z "$apt_updated" ]; then
        apt-get update -q >/dev/null
        apt_updated=1
    fi
    echo "tests/run.sh: installing Debian packages: $*" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null
}

if ! python3 -m venv .venv >/dev/null 2>&1; then  # fresh Debian: venv lives in python3-venv
    need_root "python3 venv" python3-venv
    apt_install python3-venv
    python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'

# Real tools the tests run: promtool and prometheus (rules, end to end), systemd-analyze
# (unit verification), node (evaluates the polkit rule), chromium (renders the report).
missing=()
command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
if [ "${#missing[@]}" -gt 0 ]; then
    need_root "${missing[*]}" "${missing[*]}"
    apt_install "${missing[@]}"
fi
# kubectl renders the Kubernetes manifests (`kubectl kustomize`). Debian's own
# kubernetes-client (1.20) is too old: its kustomize cannot read the overlay's `patches:`,
# so kubectl 1.21 or newer has to come from the Kubernetes project's apt repository (the
# CI image has 1.32).
if ! kubectl kustomize deploy/kubernetes/exec-probe >/dev/null 2>&1; then
    echo "tests/run.sh: 'kubectl kustomize' is missing or too old (kubectl 1.21 or newer" \
        "is needed); install kubectl from the Kubernetes project's apt repository" >&2
    exit 2
fi

# Real vLLM venvs for tests/test_vllm_engine.py and tests/test_vllm_serve.py (vLLM's own
# scheduler on a CPU; the script also installs this checkout there), one per version, built
# once and reused (~1.7 GB + deps each; see docs/simulator.md for the cost).
# WEDGEWATCH_SKIP_VLLM_VENVS=1 skips the build; those tests then skip and say how to build.
if [ -z "${WEDGEWATCH_SKIP_VLLM_VENVS:-}" ]; then
    for version in 0.30.0 0.33.0; do
        bash wedgewatch/sim/install-vllm.sh "$version" ".venv-vllm-$version"
    done
fi

.venv/bin/ruff format --check .
.venv/bin/ruff check .
.venv/bin/mypy
exec .venv/bin/python -m pytest "$@"
