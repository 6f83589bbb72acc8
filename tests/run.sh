#!/usr/bin/env bash
# The whole test suite, from a fresh machine: creates (or reuses) .venv, installs wedgewatch
# with its test tools, installs the real tools the tests use (Debian's prometheus, systemd,
# nodejs and chromium packages) when they are missing, checks that kubectl is there and new
# enough to render the manifests (it says how to install it), then runs the formatter check,
# the linter, mypy --strict and every test, slow ones included.
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
