#!/usr/bin/env bash
# gpu_wheel.sh - ckptio's GPU checks and benchmarks, run from the wheel a user installs.
#
#   scripts/gpu_wheel.sh build        on the development machine:
#       .whl/ckptio-V-cp38-abi3-manylinux_*.whl  the release wheel (scripts/build_wheel.sh)
#       build-gpu/                               the C side, which no wheel carries: gpu_check and the
#                                                libckptio.so that bench/bench_save_load_gpu.py drives through
#                                                ctypes, with their shared libraries
#                                                (tests/gpu/run_gpu_checks.sh build)
#     Carry .whl and build-gpu to the GPU machine with the working tree.
#   scripts/gpu_wheel.sh run [STEP...] on the GPU machine (no network; python3 is a Python 3.12 with
#     torch): installs the wheel into a new virtual environment (scripts/install_wheel.sh: pip
#     --no-index --no-deps; torch, pytest, safetensors... from python3's site-packages), puts it first
#     on PATH, then runs each STEP against that installation (default: pytest gpu dcp):
#       pytest  the whole Python suite, CUDA tests included, as CI runs it (CKPTIO_TEST_INSTALLED=1);
#               PYTEST_SHARD=K/N: every N-th test file from the K-th (the suite outlasts one device call)
#       gpu     tests/gpu/run_gpu_checks.sh run: gpu_check, then bench/bench_save_load_gpu.py (BENCH=0: skip it)
#       dcp     tests/gpu/run_dcp_checks.sh: DCP suites, the NCCL check on 2+ GPUs, BENCH=1: the DCP
#               benchmark
#       scale-model, scale-dcp  tests/gpu/run_scale.sh model|dcp: the scale run on 4 or 8 GPUs (one call each)
#     Logs in $OUT (default ./gpu-out). Exit status: non-zero when a step failed.
set -uo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
build)
    set -e
    scripts/build_wheel.sh .whl
    tests/gpu/run_gpu_checks.sh build
    rm -rf build-gpu/CMakeFiles
    du -sh .whl/ckptio-*.whl build-gpu
    ;;
run)
    shift
    steps=("$@")
    [ ${#steps[@]} -gt 0 ] || steps=(pytest gpu dcp)
    wheels=(.whl/ckptio-*.whl)
    [ ${#wheels[@]} -eq 1 ] && [ -f "${wheels[0]}" ] ||
        { echo "gpu_wheel.sh: want exactly one .whl/ckptio-*.whl, found: ${wheels[*]}" >&2; exit 1; }
    export OUT=${OUT:-$PWD/gpu-out}
    mkdir -p "$OUT"
    venv=$(mktemp -d)/venv
    PYTHON=${PYTHON:-python3} scripts/install_wheel.sh "${wheels[0]}" "$venv" || exit 1
    # Everything below runs the installed package: its python3 first on PATH, nothing from python/.
    unset PYTHONPATH
    export PATH="$venv/bin:$PATH" CKPTIO_TEST_INSTALLED=1 PYTHONUNBUFFERED=1
    echo "== $(basename "${wheels[0]}") installed in $venv: $(python3 -c 'import ckptio; print(ckptio.__file__)')"
    status=0
    for step in "${steps[@]}"; do
        case "$step" in
        pytest)
            # The whole suite took more than one 10-minute device call on the GPU machine (2026-11-27):
            # PYTEST_SHARD=K/N runs every N-th test file from the K-th (1-based), one shard per call.
            repo=$PWD
            files=("$repo"/tests/python/test_*.py)
            if [ -n "${PYTEST_SHARD:-}" ]; then
                k=${PYTEST_SHARD%/*} n=${PYTEST_SHARD#*/}
                [[ "$k" =~ ^[0-9]+$ && "$n" =~ ^[0-9]+$ && $k -ge 1 && $k -le $n ]] ||
                    { echo "gpu_wheel.sh: PYTEST_SHARD=$PYTEST_SHARD is not K/N with 1 <= K <= N" >&2; exit 2; }
                shard=()
                for i in "${!files[@]}"; do (( i % n == k - 1 )) && shard+=("${files[$i]}"); done
                files=("${shard[@]}")
            fi
            echo "== pytest: ${#files[@]} test files of the Python suite against the installed wheel"
            run=$(mktemp -d)
            (cd "$run" && CKPTIO_TEST_BUILD_DIR="$repo/build-gpu" python3 -m pytest -q -p no:cacheprovider -rs \
                "${files[@]}" 2>&1) | tee "$OUT/pytest.log" | tail -25
            [ "${PIPESTATUS[0]}" = 0 ] || status=1
            ;;
        gpu) tests/gpu/run_gpu_checks.sh run || status=1 ;;
        dcp) tests/gpu/run_dcp_checks.sh || status=1 ;;
        scale-model) tests/gpu/run_scale.sh model || status=1 ;;
        scale-dcp) tests/gpu/run_scale.sh dcp || status=1 ;;
        *) echo "gpu_wheel.sh: unknown step $step" >&2; status=2 ;;
        esac
    done
    exit $status
    ;;
*)
    echo "usage: $0 build | run [pytest] [gpu] [dcp] [scale-model] [scale-dcp]" >&2
    exit 2
    ;;
esac
