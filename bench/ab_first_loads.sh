#!/usr/bin/env bash
# ab_first_loads.sh - one GPU's first and second loads of a model directory, this build against a base
# build, rounds alternating the builds in one run (what BENCHMARKS.md's issue-17 sections record).
#
#   bench/ab_first_loads.sh       on the GPU machine, from the repository root, after
#                                 `scripts/gpu_wheel.sh build` and a base wheel in .whl/base/ (e.g. the
#                                 previous commit's, built the same way and copied there)
#
# Each wheel is installed into a virtual environment of its own (scripts/install_wheel.sh), peers'
# wheels in .whl/ (instanttensor) go to a --target folder; then per round: this build runs
# `CASES=$CASES FIRST=1 FIRST_ONLY=1 FIRST_WHICH=$WHICH bench/bench_model_gpu.py` and the base build
# the same with FIRST_WHICH=$BASE_WHICH. Each run's JSON lands in $OUT as ab_{new,base}_ROUND.json (the
# device tool returns at most 8 files: keep ROUNDS <= 3), the printed rows in $OUT/ab.log.
# Chart: python3 bench/plot_first_loads.py PNG new=JSON,... base=JSON,...
#
# Environment: ROUNDS (2), CASES (warm,tmpfs), WHICH (ckptio,ckptio-out,ckptio-prepared,it,it-buffered),
# BASE_WHICH (ckptio,ckptio-out), LIMIT (seconds for the whole run, 540: a run stops starting loads
# once it would pass it), OUT (./gpu-out). Extra environment (CKPTIO_* knobs) reaches both builds;
# NEW_ENV and BASE_ENV ("VAR=value ...") reach one of them. BASE=same compares the one wheel with itself
# under those two environments (a knob's A/B: BASE=same BASE_ENV=CKPTIO_GPU_READ_WORKERS=16); no
# .whl/base/ is needed then. Odd rounds run this build first, even rounds the base.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
start=$(date +%s)
LIMIT=${LIMIT:-540} ROUNDS=${ROUNDS:-2} CASES=${CASES:-warm,tmpfs}
WHICH=${WHICH:-ckptio,ckptio-out,ckptio-prepared,it,it-buffered} BASE_WHICH=${BASE_WHICH:-ckptio,ckptio-out}
export OUT=${OUT:-$PWD/gpu-out} PYTHONUNBUFFERED=1
mkdir -p "$OUT"
left() { echo $((LIMIT - ($(date +%s) - start))); }
# A run's timeout: at most $1 seconds, leaving $2 for what follows.
budget() { local l=$(($(left) - ${2:-0})); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }

new=(.whl/ckptio-*.whl) base=(.whl/base/ckptio-*.whl)
[ "${BASE:-}" = same ] && base=("${new[@]}")
if [ ! -f "${new[0]}" ] || [ ! -f "${base[0]}" ]; then
    echo "ab_first_loads.sh: want .whl/ckptio-*.whl and .whl/base/ckptio-*.whl (or BASE=same)" >&2
    exit 1
fi
read -r -a new_env <<< "${NEW_ENV:-}"
read -r -a base_env <<< "${BASE_ENV:-}"
peers=$(mktemp -d)
for w in .whl/instanttensor-*.whl; do
    [ -f "$w" ] || continue
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$peers" "$w" 2>/dev/null ||
        echo "ab_first_loads.sh: $w does not install here; its loaders will be reported as failed" | tee -a "$OUT/ab.log"
done
venvs=$(mktemp -d)
PYTHON=${PYTHON:-python3} scripts/install_wheel.sh "${new[0]}" "$venvs/new" > /dev/null || exit 1
PYTHON=${PYTHON:-python3} scripts/install_wheel.sh "${base[0]}" "$venvs/base" > /dev/null || exit 1

run() { # build which round timeout
    local build=$1 which=$2 round=$3 limit=$4 extra
    if [ "$build" = new ]; then extra=("${new_env[@]}"); else extra=("${base_env[@]}"); fi
    [ "$limit" -gt 20 ] || { echo "ab_first_loads.sh: out of time before $build round $round" | tee -a "$OUT/ab.log"; return; }
    env "${extra[@]}" PATH="$venvs/$build/bin:$PATH" CKPTIO_TEST_INSTALLED=1 PYTHONPATH="$peers" CASES="$CASES" FIRST=1 \
        FIRST_ONLY=1 FIRST_WHICH="$which" BENCH_JSON="ab_${build}_$round.json" \
        timeout "$limit" python3 bench/bench_model_gpu.py 2>&1 |
        grep -E "GB/s|fail" | grep -v ceiling | sed "s/^/$build$round /" | tee -a "$OUT/ab.log"
}

echo "== model ($(left) s left)" | tee -a "$OUT/ab.log"
env PATH="$venvs/new/bin:$PATH" CASES=none timeout "$(budget 150 60)" python3 bench/bench_model_gpu.py 2>&1 |
    grep -E "model|ceiling" | tee -a "$OUT/ab.log"
per_round=$(( ($(left) - 10) / ROUNDS ))
# A round's time is shared in proportion to the loaders each build runs.
n_new=$(($(tr -cd , <<< "$WHICH" | wc -c) + 1)) n_base=$(($(tr -cd , <<< "$BASE_WHICH" | wc -c) + 1))
t_new=$((per_round * n_new / (n_new + n_base))) t_base=$((per_round * n_base / (n_new + n_base)))
for round in $(seq 1 "$ROUNDS"); do
    echo "== round $round ($(left) s left)" | tee -a "$OUT/ab.log"
    if [ $((round % 2)) = 1 ]; then
        run new "$WHICH" "$round" "$(budget "$t_new" "$t_base")"
        run base "$BASE_WHICH" "$round" "$(budget "$t_base" 5)"
    else
        run base "$BASE_WHICH" "$round" "$(budget "$t_base" "$t_new")"
        run new "$WHICH" "$round" "$(budget "$t_new" 5)"
    fi
done
echo "done after $(($(date +%s) - start)) s" | tee -a "$OUT/ab.log"
