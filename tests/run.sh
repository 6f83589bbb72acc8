#!/usr/bin/env bash
# The test tiers, from a fresh machine (docs/development.md has the selections and timings):
#
#   bash tests/run.sh           the default tier: the formatter check, the linter, mypy --strict
#                               and every test that needs no vLLM venv, over all cores
#                               (pytest-xdist): -m "not vllm and not soak"
#   bash tests/run.sh --real    the real (heavy) tier: builds the vLLM venvs and the tiny model
#                               in the cache (wedgewatch/lab/real/install-vllm.sh, tiny_model.py) and
#                               runs every test that needs one (vLLM's own scheduler, the
#                               fidelity sweep, real vLLM behind `sim serve`, real `vllm serve`
#                               servers on the CPU under tests/real/; none may skip) and the soak
#                               tests, which watch real processes for minutes by design:
#                               -m "vllm or soak", one test at a time
#
# Both create (or reuse) .venv and install wedgewatch with its test tools; the default tier
# also installs the real tools its tests use (Debian's prometheus, prometheus-alertmanager,
# systemd, nodejs and chromium packages) when they are missing and checks that kubectl is
# there and new enough to render the manifests (it says how to install it). .ci/run runs both tiers, in that order.
# The default tier runs the property tests with fewer examples (TEST_HYPOTHESIS_PROFILE=
# quick; .ci/run sets full, the count a plain pytest uses).
# Extra arguments go to pytest (e.g. `bash tests/run.sh -m "not slow"` for the quick pass,
# `bash tests/run.sh -n 0` for one process). TEST_WORKERS sets pytest-xdist's -n (default 2
# per core: most tests wait on processes, timers and sockets).
set -euo pipefail
cd "$(dirname "$0")/.."
tier=default
if [ "${1:-}" = "--real" ]; then
    tier=real
    shift
fi

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

# A .venv with its pip is reused as it is (re-running `venv` on it reinstalls pip: seconds).
if [ ! -x .venv/bin/pip ] && ! python3 -m venv .venv >/dev/null 2>&1; then
    need_root "python3 venv" python3-venv  # fresh Debian: venv lives in python3-venv
    apt_install python3-venv
    python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'

if [ "$tier" = real ]; then
    # Real vLLM venvs for the tests marked `vllm` (tests/support/vllm_venvs.py, tests/support/real_vllm.py find
    # them), one per version, built once in ${XDG_CACHE_HOME:-~/.cache}/wedgewatch/vllm-venvs
    # and reused by every clone and run (3-3.5 GB and 2-4 min each on the dev machine;
    # docs/development.md): the scheduler venvs (the CUDA wheel's scheduler-side code; the CPU
    # build turns async scheduling off, so it cannot stand in: docs/real-vllm.md) and the
    # serving venvs (vLLM's CPU build, for the real servers of tests/real/).
    for version in 0.30.0 0.33.0; do
        bash wedgewatch/lab/real/install-vllm.sh "$version"
    done
    for version in 0.30.0 0.32.0; do
        bash wedgewatch/lab/real/install-vllm.sh --serve "$version"
    done
    # The tiny model the real servers load (random weights, same bytes every run), made once
    # with a serving venv's python, under the lock tests/support/real_vllm.py takes too.
    models="${XDG_CACHE_HOME:-$HOME/.cache}/wedgewatch/models"
    mkdir -p "$models"
    serve_venv="$(bash wedgewatch/lab/real/install-vllm.sh --dir --serve 0.30.0)"
    PYTHONPATH="$PWD" flock "$models/tiny-llama.lock" \
        "$serve_venv/bin/python" -m wedgewatch.lab.real.tiny_model "$models/tiny-llama"
    # The released code the known issues' "fixed in" claims are read in (wheels, not installed;
    # about 130 MB each, once per machine): tests/vllm/test_release_fixes.py.
    .venv/bin/python tests/support/release_code.py --fetch
    # The fuzz harness (tests/fuzz) with its long hypothesis profile: a thousand examples a
    # test instead of the default tier's few dozen.
    TEST_FUZZ_PROFILE=long .venv/bin/python -m pytest -p no:xdist tests/fuzz
    export WEDGEWATCH_REQUIRE_VLLM=1  # a missing venv fails these tests instead of skipping
    exec .venv/bin/python -m pytest -p no:xdist -m "vllm or soak" "$@"
fi

# Real tools the tests run: promtool and prometheus (rules, end to end), amtool and
# prometheus-alertmanager (routing and inhibit rules, tests/deploy/test_alertmanager.py),
# systemd-analyze (unit verification), node (evaluates the polkit rule), chromium (renders
# the report).
missing=()
command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
command -v amtool >/dev/null 2>&1 && command -v prometheus-alertmanager >/dev/null 2>&1 || missing+=(prometheus-alertmanager)
command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
if [ "${#missing[@]}" -gt 0 ]; then
    need_root "${missing[*]}" "${missing[*]}"
    apt_install "${missing[@]}"
fi
# kubectl renders the Kubernetes manifests (`kubectl kustomize`). It has to be 1.21 or newer:
# kubectl 1.14-1.20 carry kustomize v2.0.3, which cannot read the exec-probe overlay's
# `patches:` (1.21 moved to kustomize v4). Debian's own kubernetes-client is 1.20, so kubectl
# comes from the Kubernetes project's apt repository, pkgs.k8s.io (the CI image has 1.32).
# A kubectl that is new enough but cannot render the manifests is the manifests' fault:
# tests/deploy/test_kubernetes.py then fails and shows kustomize's error.
kubectl_help() {
    cat >&2 <<'EOF'
Install kubectl from the Kubernetes project's apt repository (Debian's kubernetes-client is 1.20):
  sudo apt-get install -y ca-certificates curl gnupg
  sudo install -d -m 0755 /etc/apt/keyrings
  curl -fsSL https://pkgs.k8s.io/core:/stable:/v1.32/deb/Release.key \
    | sudo gpg --dearmor -o /etc/apt/keyrings/kubernetes-apt-keyring.gpg
  echo 'deb [signed-by=/etc/apt/keyrings/kubernetes-apt-keyring.gpg] https://pkgs.k8s.io/core:/stable:/v1.32/deb/ /' \
    | sudo tee /etc/apt/sources.list.d/kubernetes.list
  sudo apt-get update && sudo apt-get install -y kubectl
EOF
    exit 2
}
if ! command -v kubectl >/dev/null 2>&1; then
    echo "tests/run.sh: kubectl is missing: the manifests are rendered with 'kubectl kustomize'" \
        "(kubectl 1.21 or newer)" >&2
    kubectl_help
fi
# Prints the client's version when it is older than 1.21 (or unreadable); nothing otherwise.
kubectl_too_old=$(kubectl version --client -o json 2>/dev/null | .venv/bin/python -c '
import json, re, sys
try:
    v = json.load(sys.stdin)["clientVersion"]
    version = (int(v["major"]), int(re.match(r"\d+", v["minor"])[0]))
except (ValueError, KeyError, TypeError):
    print("of unknown version")
    sys.exit()
if version < (1, 21):
    print("%d.%d" % version)
' || true)
if [ -n "$kubectl_too_old" ]; then
    echo "tests/run.sh: $(command -v kubectl) is kubectl $kubectl_too_old; 'kubectl kustomize'" \
        "needs kubectl 1.21 or newer" >&2
    kubectl_help
fi

.venv/bin/ruff format --check .
.venv/bin/ruff check .
.venv/bin/mypy
# The property tests' example count (tests/conftest.py): `quick` here, `full` in .ci/run.
export TEST_HYPOTHESIS_PROFILE="${TEST_HYPOTHESIS_PROFILE:-quick}"
# The tests go out to the workers one at a time, slow ones first, a module with a shared
# fixture whole (tests/support/scheduling.py): no worker is left with a queue of end-to-end
# runs while the others are idle.
exec .venv/bin/python -m pytest -n "${TEST_WORKERS:-$(($(nproc) * 2))}" -m "not vllm and not soak" "$@"
