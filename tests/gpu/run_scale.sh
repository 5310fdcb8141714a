#!/usr/bin/env bash
# run_scale.sh - the scale run on every GPU of one host (4 or 8), in two parts that each fit
# one device call. Runs the ckptio that python3 imports: `scripts/gpu_wheel.sh run scale-model` and
# `... run scale-dcp` install the wheel first, as for the other steps.
#
#   tests/gpu/run_scale.sh model   a Hugging Face directory of GIB (30) GiB written by safetensors, loaded
#                                  to every GPU: bench/bench_model_tp.py (tensor parallel over all ranks and
#                                  replicas, cold and warm, ckptio read-once beside every rank loading it,
#                                  safetensors get_slice and fastsafetensors with the process group), then
#                                  tests/gpu/model_nccl_check.py on all ranks (every byte compared)
#   tests/gpu/run_scale.sh dcp     tests/gpu/dcp_nccl_check.py on all ranks with the default 256 MB state
#                                  dict (every writer and reader), then a DCP_MB (32768) MB sharded state
#                                  dict saved by ckptio.dcp and torch's writer (thread_count 8), loaded on
#                                  all ranks (broadcast on and off, same and other sharding, by both
#                                  readers), then resharded to half the ranks (--load-only); every byte
#                                  compared
# The large loads run with the page cache dropped before each (LARGE_CACHE, default cold: both readers
# read the disk), the half-rank loads with the checkpoint read into it first (HALF_CACHE, default warm);
# dcp_nccl_check.py --cache says why. SKIP_SMALL=1 leaves out the 256 MB check.
# Environment: OUT (logs and JSON, default ./gpu-out), SCRATCH (default /var/tmp; the model part needs
# ~GIB GiB, the DCP part 2 x DCP_MB), LIMIT (seconds for the whole part, default 540: each step gets
# what is left, so a slow step cannot push the call past the device's limit), GIB, DCP_MB, VARIANTS and
# REPS (bench_model_tp.py's; 0 and 1 here: one warm load per loader, no other ckptio settings). For a dry run
# of the DCP part on the CPU: RANKS=4 DCP_MB=8 DCP_ARGS="--backend gloo --device cpu" (RANKS defaults to
# the GPU count).
# Time: on 4 x H100 with a 1.3-1.5 GB/s disk (2026-11-27) the model part's benchmark alone outlasted one
# 540 s call (every rank loading the whole 28 GB model cold took 87-91 s per mode); run it in two calls,
# MODES=tp SKIP_NCCL=1, then MODES=replicas (bench_model_tp.py reads MODES; SKIP_NCCL=1 leaves out the
# NCCL check, which the second call runs).
# The DCP part on 4 x H200 (2026-11-27, 98e6843): the 32 GB run with cold loads took ~390 s of a 565 s call
# (saves 16 + 25 s, loads 25-45 s each, the rest starting ranks and making values); the half-rank run then
# ran out of time making its values on the CPU, which dcp_nccl_check.py no longer does (28cea10). If it
# still does not fit, run it alone in a second call (it needs the first call's checkpoints: same machine).
# Exit status: non-zero when a check failed or a step ran out of time.
set -uo pipefail
cd "$(dirname "$0")/../.."
part=${1:-}
OUT=${OUT:-$PWD/gpu-out}
SCRATCH=${SCRATCH:-/var/tmp}
LIMIT=${LIMIT:-540}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# NVLink multicast stays off on shared hosts (the device notes say why).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
start=$(date +%s)
left() { echo $(( LIMIT - ($(date +%s) - start) )); }
status=0
ngpu=${RANKS:-$(python3 -c 'import torch; print(torch.cuda.device_count())')}
half=$(( ngpu / 2 ))
dcp_args=${DCP_ARGS:-}
TORCHRUN="python3 -m torch.distributed.run --standalone"
run() {  # run LOG CMD...: under what is left of LIMIT; the log in $OUT, its verdict lines here
    local log=$1
    shift
    local t
    t=$(left)
    if [ "$t" -lt 20 ]; then
        echo "   skipped ($t s left): $*" | tee -a "$OUT/$log"
        status=1
        return
    fi
    timeout "$t" "$@" >"$OUT/$log" 2>&1
    local rc=$?
    grep -E "PASS|FAIL|GB/s|^time|passed|failed|Error" "$OUT/$log" | tail -40
    [ "$rc" = 0 ] || { echo "   exit $rc: $*"; status=1; }
}
echo "== $part: $ngpu ranks, $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)," \
    "$(nproc) cores, $(python3 -c 'import ckptio; print("ckptio", ckptio.__version__)'), $(left) s"
if [ "$ngpu" -lt 4 ]; then
    echo "run_scale.sh: wants 4 or 8 GPUs, found $ngpu" >&2
    exit 2
fi

case "$part" in
model)
    # The peers that are not on the GPU machine travel as wheels in .whl/ (the device notes say how).
    peers=$(ls .whl/fastsafetensors-*.whl 2>/dev/null | head -1)
    if [ -n "$peers" ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --target "$SCRATCH/ckptio-scale-peers" "$peers" &&
            export PYTHONPATH="$SCRATCH/ckptio-scale-peers${PYTHONPATH:+:$PYTHONPATH}"
    else
        echo "   no .whl/fastsafetensors-*.whl: bench_model_tp.py reports that peer as failed"
    fi
    echo "== bench_model_tp.py: ${GIB:-30} GiB, $ngpu ranks ($(left) s left)"
    run bench_model_tp.log env GIB="${GIB:-30}" MODEL_DIR="$SCRATCH/ckptio-scale-model" OUT="$OUT" \
        VARIANTS="${VARIANTS:-0}" REPS="${REPS:-1}" \
        $TORCHRUN --nproc_per_node="$ngpu" bench/bench_model_tp.py
    if [ "${SKIP_NCCL:-0}" = 1 ]; then
        echo "== model_nccl_check.py: skipped (SKIP_NCCL=1)"
    else
        echo "== model_nccl_check.py: $ngpu ranks ($(left) s left)"
        run model_nccl.log $TORCHRUN --nproc_per_node="$ngpu" tests/gpu/model_nccl_check.py --dir "$SCRATCH/ckptio-scale-nccl" \
            --out "$OUT" --size-mb 1024
    fi
    rm -rf "$SCRATCH/ckptio-scale-model" "$SCRATCH/ckptio-scale-nccl" "$SCRATCH/ckptio-scale-peers"
    ;;
dcp)
    if [ "${SKIP_SMALL:-0}" = 1 ]; then
        echo "== dcp_nccl_check.py, 256 MB: skipped (SKIP_SMALL=1)"
    else
        echo "== dcp_nccl_check.py: every writer and reader, 256 MB, $ngpu ranks ($(left) s left)"
        run dcp_nccl_small.log $TORCHRUN --nproc_per_node="$ngpu" tests/gpu/dcp_nccl_check.py \
            --dir "$SCRATCH/ckptio-scale-dcp" --size-mb 256 $dcp_args
    fi
    echo "== dcp_nccl_check.py: ${DCP_MB:-32768} MB, thread_count 8, $ngpu ranks ($(left) s left)"
    run dcp_nccl_large.log $TORCHRUN --nproc_per_node="$ngpu" tests/gpu/dcp_nccl_check.py \
        --dir "$SCRATCH/ckptio-scale-dcp" --out "$OUT" --size-mb "${DCP_MB:-32768}" --threads 8 \
        --saves ckptio_tN,torch_stock --keep --cache "${LARGE_CACHE:-cold}" $dcp_args
    echo "== the same checkpoints loaded by $half ranks ($(left) s left)"
    mkdir -p "$OUT/half" # its dcp_nccl_check.json beside, not over, the full run's
    run dcp_nccl_half.log $TORCHRUN --nproc_per_node="$half" tests/gpu/dcp_nccl_check.py \
        --dir "$SCRATCH/ckptio-scale-dcp" --out "$OUT/half" --size-mb "${DCP_MB:-32768}" --threads 8 \
        --saves ckptio_tN,torch_stock --load-only --cache "${HALF_CACHE:-warm}" $dcp_args
    rm -rf "$SCRATCH/ckptio-scale-dcp"
    ;;
*)
    echo "usage: $0 model | dcp" >&2
    exit 2
    ;;
esac
echo "== $part done after $(( $(date +%s) - start )) s, status $status"
exit $status
