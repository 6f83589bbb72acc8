#!/usr/bin/env bash
# Build a venv holding a real vLLM whose scheduler-side code runs on a CPU, for
# `wedgewatch/sim/vllm_engine.py` (vLLM's own v1 scheduler, KV-cache manager and KV
# connectors driven by an emulated GPU side) and `wedgewatch sim serve --scheduler vllm`
# (sim/vllm_core.py), with this checkout installed in it:
#
#   bash wedgewatch/sim/install-vllm.sh VERSION VENV      e.g. 0.30.0 .venv-vllm-0.30.0
#   VENV/bin/wedgewatch sim serve --scheduler vllm ...
#
# Reuses VENV when it already imports that vLLM's scheduler (step 5 still runs). Steps:
#   1. python3 -m venv VENV
#   2. pip install torch==2.13.0   -- exactly this spelling: the CPU wheel lies on this
#      machine's disk (/opt/wheels). ANY other torch spelling downloads GBs of CUDA.
#   3. pip install --no-deps vllm==VERSION
#   4. the packages the scheduler, connector and metrics imports need (found by trying; see
#      VLLM_IMPORT_DEPS). Never `pip install vllm` without --no-deps: that pulls CUDA builds.
#   5. this checkout, editable (`pip install -e`), with wedgewatch's own light dependencies
#      that vLLM's set lacks (uvicorn, setproctitle, structlog, py-spy; already-present ones
#      are left as they are).
# Measured on the 2-core dev machine (2026-12-02): ~2.5 min and ~1.7 GB for steps 1-3, ~3.1 GB
# and ~8 min more for step 4 under load (triton comes in through xgrammar).
set -euo pipefail
if [ "$#" -ne 2 ]; then
    echo "usage: $0 VLLM_VERSION VENV_DIR" >&2
    exit 2
fi
version="$1"
venv="$2"
VLLM_IMPORT_DEPS=(
    numpy packaging regex pydantic cbor2 psutil pyzmq urllib3 transformers aiohttp requests
    openai-harmony pillow pybase64 cachetools msgspec cloudpickle uvloop py-cpuinfo
    prometheus_client fastapi partial_json_parser xgrammar llguidance einops
    openai httpx  # httpx: wedgewatch.sim.load (the plans) imports it
)
probe='
import vllm, vllm.config, vllm.v1.core.sched.scheduler, vllm.v1.core.sched.async_scheduler
from vllm.distributed.kv_transfer.kv_connector.v1 import offloading_connector
from vllm.distributed.kv_transfer.kv_connector.v1 import simple_cpu_offload_connector
import vllm.v1.metrics.loggers
import sys
sys.exit(0 if vllm.__version__ == sys.argv[1] else 3)
'
py="$venv/bin/python"
checkout="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
pip_install() {
    "$py" -m pip install -q --disable-pip-version-check "$@" 2>&1 \
        | grep -v -e '^WARNING: Location' -e 'requires' -e 'dependency' -e 'conflict' || true
}
install_checkout() {
    if ! "$py" -c 'import wedgewatch.sim.vllm_core, uvicorn, setproctitle, structlog' \
        >/dev/null 2>&1; then
        pip_install -e "$checkout"
    fi
    "$py" -c 'import wedgewatch.sim.vllm_core, uvicorn, setproctitle, structlog'
}
if [ -x "$py" ] && "$py" -c "$probe" "$version" >/dev/null 2>&1; then
    install_checkout
    echo "$venv: vLLM $version already importable; run $venv/bin/wedgewatch"
    exit 0
fi
[ -x "$py" ] || python3 -m venv "$venv"
pip_install torch==2.13.0
pip_install --no-deps "vllm==$version"
pip_install "${VLLM_IMPORT_DEPS[@]}"
if ! "$py" -c "$probe" "$version" >/dev/null 2>"$venv/import-error.txt"; then
    echo "$venv: vLLM $version still does not import; see $venv/import-error.txt" >&2
    tail -3 "$venv/import-error.txt" >&2
    exit 1
fi
install_checkout
echo "$venv: vLLM $version ready ($(du -sh "$venv" | cut -f1)); run $venv/bin/wedgewatch"
