#!/usr/bin/env bash
# run_dcp_checks.sh - ckptio.dcp on a GPU machine: the Python DCP suites with
# CUDA, the multi-GPU NCCL checks (when the machine has 2+ GPUs: DCP, and the
# read-once model load), and the DCP benchmark against torch DCP (BENCH=1).
#
# Runs the ckptio that python3 imports: scripts/gpu_wheel.sh run dcp installs
# the wheel (.whl/) into a new virtual environment and runs this script with
# that environment first on PATH.
# Environment: OUT (logs, default ./gpu-out), SCRATCH (test files, default
# /tmp; the benchmark needs ~20 GiB), BENCH=1 (run bench/bench_dcp_gpu.py),
# SIZE_GIB (benchmark state dict, default 8), NCCL_SIZE_MB (default 256), MODEL_SIZE_MB (the
# model of tests/gpu/model_nccl_check.py, default 1024).
# Exit status: non-zero when a check failed (the benchmark's own failures are
# in its log).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
SCRATCH=${SCRATCH:-/tmp}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# NVLink multicast stays off on shared hosts (see the device notes).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
status=0

ngpu=$(python3 -c 'import torch; print(torch.cuda.device_count())')
echo "== $(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | xargs), $ngpu GPU(s), torch" \
    "$(python3 -c 'import torch; print(torch.__version__)')", \
    "$(python3 -c 'import ckptio; print("ckptio", ckptio.__version__, "from", ckptio.__file__)')"

echo "== pytest: DCP suites (CUDA tests included)"
python3 -m pytest -q -p no:cacheprovider -p no:logging tests/python/test_dcp*.py tests/python/test_faults_dcp.py \
    tests/python/test_cli_dcp.py 2>&1 | tee "$OUT/pytest_dcp.log" | tail -5 || status=1

if [ "$ngpu" -ge 2 ]; then
    echo "== NCCL: 2 ranks, one GPU each"
    rm -rf "$SCRATCH/ckptio-nccl"
    timeout 420 python3 -m torch.distributed.run --standalone --nproc_per_node=2 tests/gpu/dcp_nccl_check.py --dir "$SCRATCH/ckptio-nccl" \
        --out "$OUT" --size-mb "${NCCL_SIZE_MB:-256}" 2>&1 | tee "$OUT/nccl.log" | grep -E "PASS|FAIL|time|Error" \
        || status=1
    rm -rf "$SCRATCH/ckptio-nccl"
    echo "== NCCL: model read once per node (tests/gpu/model_nccl_check.py), 2 ranks"
    timeout 420 python3 -m torch.distributed.run --standalone --nproc_per_node=2 tests/gpu/model_nccl_check.py \
        --dir "$SCRATCH/ckptio-model-nccl" --out "$OUT" --size-mb "${MODEL_SIZE_MB:-1024}" 2>&1 \
        | tee "$OUT/model_nccl.log" | grep -E "PASS|FAIL|time|Error" || status=1
    rm -rf "$SCRATCH/ckptio-model-nccl"
else
    echo "== NCCL check skipped: $ngpu GPU(s)"
fi

if [ "${BENCH:-0}" = 1 ]; then
    echo "== bench/bench_dcp_gpu.py"
    DIR="$SCRATCH/ckptio-bench" python3 bench/bench_dcp_gpu.py 2>&1 | tee "$OUT/bench_dcp_gpu.log" | grep -v "^RESULTS"
    rm -rf "$SCRATCH/ckptio-bench"
fi
exit $status
