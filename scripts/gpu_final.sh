#!/usr/bin/env bash
# gpu_final.sh - the snapshot checks and the training-loop benchmark in ONE device call, every part bounded.
#
#   scripts/gpu_wheel.sh build     on the development machine: .whl/ (the release wheel) and build-gpu/
#                                  (gpu_check, fork_check and their libraries); carry both with the tree
#   scripts/gpu_final.sh           on the GPU machine (python3 3.12 with torch, no network):
#     1. install   the wheel into a new virtual environment (scripts/install_wheel.sh), first on PATH
#     2. pytest    tests/python/test_py_gpu.py and test_snapshot_gpu.py against the installed wheel
#     3. gpucheck  tests/gpu/run_gpu_checks.sh run, QUICK=1 BENCH=0 (gpu_check without the >4 GiB case,
#                  fork_check); skipped when build-gpu/gpu_check was not carried
#     4. bench     bench/bench_training_loop.py: the targets' write ceilings, then $RUNS in that order (a run
#                  that no longer fits in the time left is skipped and said so); without a GPU its --smoke
#     5. a short table of the parts and of the benchmark, printed last
#   Each part runs under `timeout` (its own cap, never past the budget), so the whole call ends in BUDGET
#   seconds even when a part hangs. The plan and its estimated time are printed first.
# Environment: BUDGET (seconds for the whole script, default 540), OUT (results, default ./gpu-out; at most 8
#   files: final.log, pytest.log, gpu_checks.log, training_loop.json, the charts), RUNS (the benchmark's runs,
#   TARGET:EVERY:SAVES:METHODS;... see bench/bench_training_loop.py), DISK (the disk target's directory,
#   default ./bench-disk), PYTHON (default python3).
# Options: --smoke  the benchmark's --smoke mode instead of $RUNS (also chosen when torch sees no GPU);
#          --skip P  leave part P out (install, pytest, gpucheck, bench; repeatable).
# Exit status: 0 when every part that ran passed, 1 otherwise (skipped parts say why in the table).
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
BUDGET=${BUDGET:-540}
OUT=${OUT:-$PWD/gpu-out}
PYTHON=${PYTHON:-python3}
DISK=${DISK:-$PWD/bench-disk}
RUNS=${RUNS:-"tmpfs:10:1:none;tmpfs:10:2:ckptio_manager,ckptio_manager_skip,torch,ckptio_writer;\
disk:10:2:ckptio_manager,ckptio_manager_skip,torch;tmpfs:50:2:ckptio_manager,torch;\
tmpfs:10:2:torch_cached,torch_process"}
SMOKE=0
SKIP=" "
while [ $# -gt 0 ]; do
    case "$1" in
    --smoke) SMOKE=1 ;;
    --skip) shift; SKIP+="${1:-} " ;;
    *) echo "usage: $0 [--smoke] [--skip install|pytest|gpucheck|bench]..." >&2; exit 2 ;;
    esac
    shift
done
T0=$(date +%s)
RESERVE=15  # seconds kept for the table and the copy of the results
mkdir -p "$OUT"
LOG=$OUT/final.log
: >"$LOG"
TABLE=()
STATUS=0

left() { echo $((BUDGET - ($(date +%s) - T0) - RESERVE)); }
say() { echo "$*" | tee -a "$LOG"; }

# part NAME CAP COMMAND...: runs COMMAND under timeout (CAP seconds, never past the budget), output to the log.
part() {
    local name=$1 cap=$2 l
    shift 2
    l=$(left)
    if [[ "$SKIP" == *" $name "* ]]; then
        TABLE+=("$(printf '%-9s %-8s %s' "$name" skipped "(--skip)")")
        return 0
    fi
    ((cap > l)) && cap=$l
    if ((cap < 10)); then
        say "== $name: not run, ${l} s left"
        TABLE+=("$(printf '%-9s %-8s %s' "$name" skipped "(budget: ${l} s left)")")
        return 0
    fi
    say "== $name (at most ${cap} s, $(date +%T))"
    local t=$(date +%s) rc
    # A part is a shell function: timeout runs it in a bash of its own (functions and settings exported).
    timeout -k 5 "$cap" bash -c '"$@"' part "$@" >>"$LOG" 2>&1
    rc=$?
    local took=$(($(date +%s) - t)) word=ok
    ((rc == 124 || rc == 137)) && word=timeout
    ((rc != 0 && rc != 124 && rc != 137)) && word="exit $rc"
    ((rc != 0)) && STATUS=1
    say "== $name: $word after ${took} s"
    TABLE+=("$(printf '%-9s %-8s %4d s' "$name" "$word" "$took")")
    return 0
}

{
    echo "gpu_final.sh $(date -u +%FT%TZ) budget ${BUDGET} s, out $OUT"
    uname -r
    command -v nvidia-smi >/dev/null &&
        timeout -k 2 20 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    df -hT /dev/shm "$(dirname "$DISK")" 2>/dev/null | tail -n +2
    nproc
} 2>&1 | tee -a "$LOG"

# The parts: shell functions run by part() under timeout, so they see only exported settings.
VENV=$(mktemp -d)/venv
export REPO OUT PYTHON DISK RUNS VENV SMOKE RESERVE BUDGET T0

install() {  # the wheel as a user installs it; everything after imports it, nothing from python/
    local wheels=(.whl/ckptio-*.whl)
    [ ${#wheels[@]} -eq 1 ] && [ -f "${wheels[0]}" ] ||
        { echo "want exactly one .whl/ckptio-*.whl (scripts/gpu_wheel.sh build), found: ${wheels[*]}"; return 1; }
    PYTHON=$PYTHON scripts/install_wheel.sh "${wheels[0]}" "$VENV" &&
        "$VENV/bin/python" -c 'import ckptio, torch; print("ckptio", ckptio.__version__, ckptio.__file__,
"torch", torch.__version__, "cuda", torch.cuda.is_available())'
}

run_pytest() {  # the GPU tests of the snapshot and of the Python package, against the installed wheel
    local run
    run=$(mktemp -d)
    (cd "$run" && CKPTIO_TEST_BUILD_DIR="$REPO/build-gpu" python3 -m pytest -q -p no:cacheprovider -rs \
        "$REPO/tests/python/test_py_gpu.py" "$REPO/tests/python/test_snapshot_gpu.py" 2>&1) |
        tee "$OUT/pytest.log" | tail -5
    return "${PIPESTATUS[0]}"
}

run_gpucheck() {  # gpu_check --quick and fork_check; their three logs in one file (the results stay <= 8)
    [ -x build-gpu/gpu_check ] || { echo "no build-gpu/gpu_check (scripts/gpu_wheel.sh build makes it)"; return 3; }
    local tmp rc
    tmp=$(mktemp -d)
    OUT=$tmp QUICK=1 BENCH=0 tests/gpu/run_gpu_checks.sh run >/dev/null 2>&1
    rc=$?
    cat "$tmp"/machine.txt "$tmp"/gpu_check.log "$tmp"/fork_check.log >"$OUT/gpu_checks.log" 2>/dev/null
    tail -n 3 "$tmp"/gpu_check.log "$tmp"/fork_check.log 2>/dev/null
    ((rc == 77)) && { echo "no GPU: gpu_check skipped itself"; return 0; }
    return $rc
}

run_bench() {  # its deadline is the time left: it skips the runs that would not fit, said so in its output
    local left=$((BUDGET - ($(date +%s) - T0) - RESERVE - 10))
    if [ "$SMOKE" = 1 ]; then
        python3 bench/bench_training_loop.py "$OUT" --smoke --no-charts --deadline "$left"
    else
        python3 bench/bench_training_loop.py "$OUT" --runs "$RUNS" --ceilings --disk "$DISK" --run-seconds 25 \
            --step-seconds 0.36 --deadline "$left"
    fi
}
export -f install run_pytest run_gpucheck run_bench

part install 120 install
if [ -x "$VENV/bin/python" ]; then
    unset PYTHONPATH
    export PATH="$VENV/bin:$PATH" CKPTIO_TEST_INSTALLED=1 PYTHONUNBUFFERED=1
fi
if [ "$SMOKE" = 0 ] &&
    ! timeout -k 5 30 python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null
then
    say "no CUDA device seen by torch: the benchmark runs in its --smoke mode"
    SMOKE=1
fi
if [ "$SMOKE" = 1 ]; then
    say "plan: pytest <=150 s, gpucheck <=120 s, bench --smoke (every method, a small model)"
else
    say "plan: pytest <=150 s, gpucheck <=120 s, bench: the rest of ${BUDGET} s less ${RESERVE} s, its runs:"
    say "  $RUNS"
fi
part pytest 150 run_pytest
part gpucheck 120 run_gpucheck
part bench "$(left)" run_bench

# 5. the table: the parts, then the benchmark's summary (training_loop.json).
say ""
say "part      result   time"
for row in "${TABLE[@]}"; do say "$row"; done
if [ -f "$OUT/training_loop.json" ]; then
    timeout -k 2 $((RESERVE - 5)) python3 - "$OUT/training_loop.json" <<'EOF' 2>&1 | tee -a "$LOG"
import json, sys
doc = json.load(open(sys.argv[1]))
print(f"\nplain step {doc.get('plain_step_ms')} ms; write ceilings GB/s {doc.get('write_ceilings_gbps')}")
print(f"{'method':20} {'target':6} {'every':>5} {'mean%':>7} {'1st save ms':>11} {'later saves +ms':24} "
      f"{'durable s':18} {'skipped':10} exact")
base = doc.get("plain_step_ms") or 0
for r in doc["results"]:
    s = r.get("summary")
    if not s:
        print(f"{r['method']:20} {r['target']:6} {r['every']:>5} " + ("not run (%s)" % r["skipped"] if "skipped" in r
                                                                     else "FAILED"))
        continue
    later = [round(v - base, 1) for v in s["later_saves_ms"]]
    durable = [round(v, 1) for v in s["durable_s"]]
    print(f"{r['method']:20} {r['target']:6} {r['every']:>5} {s['mean_overhead_pct']:7.2f} "
          f"{s['first_save_over_plain_ms'] or 0:+11.1f} {str(later):24} {str(durable):18} "
          f"{str(s['skipped_steps']):10} {s['exact']}")
EOF
fi
[ -f "$OUT/training_loop.json" ] || say "no benchmark results (training_loop.json)"
say "total $(($(date +%s) - T0)) s of ${BUDGET} s; results in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
exit $STATUS
