#!/usr/bin/env bash
# run_gpu_checks.sh - ckptio's checks and benchmark on a GPU machine.
#
# The GPU machine has no compiler packages and no network, so building and
# running are separate steps:
#   tests/gpu/run_gpu_checks.sh build   on the dev machine: Release libckptio,
#                                       tests/gpu/gpu_check, and the shared
#                                       libraries they need, all in build-gpu/
#                                       (carry that directory to the GPU machine)
#   tests/gpu/run_gpu_checks.sh run     on the GPU machine: gpu_check (every
#                                       byte compared, ~1-2 min), fork_check
#                                       (CUDA in fork()ed children, seconds),
#                                       then bench/bench_save_load_gpu.py (~6 min); logs in $OUT
#   tests/gpu/run_gpu_checks.sh         build if build-gpu/gpu_check is missing, then run
# bench_save_load_gpu.py's Python-package rows use the ckptio that python3 imports:
# scripts/gpu_wheel.sh (build, then run gpu) installs the wheel first and runs
# this script with it.
# Environment: OUT (log directory, default ./gpu-out), SCRATCH (directory for
# test files, default /tmp; needs ~10 GiB free), CKPTIO_TEST_GPU_BUILD (build dir),
# QUICK=1 (gpu_check without the >4 GiB case), BENCH=0 (skip the benchmark).
# Exit status: that of gpu_check, or 1 if fork_check failed (0 pass, 77 no GPU); the benchmark's
# failures are reported in its log.
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${CKPTIO_TEST_GPU_BUILD:-build-gpu}

build() {
    set -e
    cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DCKPTIO_TESTS=OFF >/dev/null
    cmake --build "$B" -j2 --target ckptio ckptio_static
    ${CC:-cc} -std=gnu11 -O2 -g -D_GNU_SOURCE -DCKPTIO_EXPERIMENTAL -Wall -Wextra -Werror -Iinclude -Isrc/common \
        -Isrc/objstore -Isrc/io -Isrc/engine -Isrc/gpu \
        tests/gpu/gpu_check.c "$B/libckptio.a" -o "$B/gpu_check" \
        -luring -ljansson -lzstd -lxxhash -lcurl -lcrypto -lz -ldl -lpthread -lm
    ${CC:-cc} -std=gnu11 -O2 -g -D_GNU_SOURCE -DCKPTIO_EXPERIMENTAL -Wall -Wextra -Werror -Iinclude -Isrc/common \
        -Isrc/objstore -Isrc/io -Isrc/engine -Isrc/gpu \
        tests/gpu/fork_check.c "$B/libckptio.a" -o "$B/fork_check" \
        -luring -ljansson -lzstd -lxxhash -lcurl -lcrypto -lz -ldl -lpthread -lm
    mkdir -p "$B/lib"
    # Every shared library libckptio needs beyond glibc (liburing, jansson, zstd, xxhash, libcurl and
    # OpenSSL with what they link), since the GPU machine has no compiler packages.
    ldd "$B/libckptio.so" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | while read -r path; do
        case "$(basename "$path")" in
        libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|libresolv.so.*|ld-linux*) ;;
        *) cp -L "$path" "$B/lib/" ;;
        esac
    done
    # libckptio.so.0 is what dlopen/ctypes users load; keep a plain copy too.
    cp -L "$B/libckptio.so" "$B/lib/libckptio.so"
    set +e
    echo "built $B/gpu_check and $B/lib/ (carry $B to the GPU machine)"
}

run() {
    OUT=${OUT:-$PWD/gpu-out}
    SCRATCH=${SCRATCH:-/tmp}
    mkdir -p "$OUT"
    export LD_LIBRARY_PATH="$PWD/$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    {
        date; uname -a; nvidia-smi 2>&1 | head -20
        df -hT "$SCRATCH"; ls /proc/driver/nvidia-fs 2>&1; ls -l /etc/cufile.json 2>&1
    } >"$OUT/machine.txt" 2>&1
    echo "== gpu_check"
    t0=$(date +%s)
    timeout 300 "$B/gpu_check" "$SCRATCH" ${QUICK:+--quick} 2>&1 | tee "$OUT/gpu_check.log"
    rc=${PIPESTATUS[0]}
    echo "gpu_check exit $rc after $(( $(date +%s) - t0 )) s" | tee -a "$OUT/gpu_check.log"
    echo "== fork_check"
    timeout 200 "$B/fork_check" "$SCRATCH" 2>&1 | tee "$OUT/fork_check.log"
    frc=${PIPESTATUS[0]}
    echo "fork_check exit $frc" | tee -a "$OUT/fork_check.log"
    [ "$frc" = 1 ] && rc=1
    if [ "${BENCH:-1}" != 0 ]; then
        echo "== bench_save_load_gpu.py"
        CKPTIO_TEST_LIB="$PWD/$B/lib/libckptio.so" DIR="$SCRATCH/ckptio-bench" \
            timeout 480 python3 bench/bench_save_load_gpu.py 2>&1 | tee "$OUT/bench_save_load_gpu.log"
        echo "bench exit ${PIPESTATUS[0]}" | tee -a "$OUT/bench_save_load_gpu.log"
    fi
    return "$rc"
}

case "${1:-all}" in
build) build ;;
run) run ;;
all)
    [ -x "$B/gpu_check" ] || build || exit 1
    run
    ;;
*) echo "usage: $0 [build|run]"; exit 2 ;;
esac
