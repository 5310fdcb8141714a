#!/usr/bin/env bash
# test.sh - set everything up and run every test ckptio has (CPU only).
#
#  0. the source layers depend one way (scripts/check_layers.py); C lines are at most 120 columns
#     (scripts/check_line_length.py)
#  1. build with -Werror and run the C tests (ctest)
#  2. build with AddressSanitizer + UndefinedBehaviorSanitizer, run them again
#  3. the wheel as a release makes it (sdist, wheel built from it, auditwheel repair), installed into a
#     new virtual environment; its binaries hold no test double and no source path
#     (tests/check_shipped.py); the whole Python suite (the CLI tests included) runs against that
#     installation, from outside the checkout (scripts/build_wheel.sh, scripts/install_wheel.sh)
#  4. each libFuzzer harness for a short fixed time on its committed corpus
# A real S3 server (scripts/s3_server.sh: OpenStack Swift on 127.0.0.1) runs from before the C tests to
# the end; the object storage tests find it through AWS_ENDPOINT_URL and the other AWS_* variables.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --python
jobs=$(nproc)
failed=0

echo "== layers: includes and calls between src/ directories and files go one way"
python3 scripts/check_layers.py || failed=1

echo "== C lines of src/, include/, python/src/, tools/, tests/ and fuzz/ are at most 120 columns"
python3 scripts/check_line_length.py || failed=1

echo "== bench/'s benchmarks parse (they run on GPU machines: bench/README.md)"
python3 -c 'import ast, sys; [ast.parse(open(f).read(), f) for f in sys.argv[1:]]' bench/*.py || failed=1

echo "== S3 server for the object storage tests (scripts/s3_server.sh; stopped when this script ends)"
# A block of ports of this run's own (the S3 endpoint and the four after it), so that the test runs of two
# checkouts on one machine never share, or stop, each other's server; CKPTIO_TEST_S3_PORT picks one instead.
if [ -z "${CKPTIO_TEST_S3_PORT:-}" ]; then
    CKPTIO_TEST_S3_PORT=$(python3 -c '
import random, socket
for _ in range(500):
    base, socks = random.randrange(20000, 32000, 8), []
    try:
        for port in range(base, base + 5):
            socks.append(socket.socket())
            socks[-1].bind(("127.0.0.1", port))
        print(base)
        break
    except OSError:
        pass
    finally:
        for s in socks:
            s.close()
')
    export CKPTIO_TEST_S3_PORT
fi
s3_t0=$SECONDS
if s3_env=$(scripts/s3_server.sh start); then
    eval "$s3_env"
    trap 'scripts/s3_server.sh stop' EXIT
    echo "-- listening at $AWS_ENDPOINT_URL after $((SECONDS - s3_t0)) s"
else
    echo "the S3 server did not start: the object storage tests would only be skipped"; failed=1
fi

echo "== C tests (release build)"
(cd build && ctest --output-on-failure -j"$jobs") || failed=1

echo "== install, then build a consumer with pkg-config and with find_package(ckptio)"
inst=$(mktemp -d)
cmake --install build --prefix "$inst" >/dev/null
pc="$inst/lib/pkgconfig"
cc tests/install/consumer.c $(PKG_CONFIG_PATH="$pc" pkg-config --cflags --libs ckptio) \
    -Wl,-rpath,"$inst/lib" -o "$inst/consumer_pc" && "$inst/consumer_pc" || failed=1
cmake -S tests/install -B "$inst/build" -DCMAKE_PREFIX_PATH="$inst" >/dev/null &&
    cmake --build "$inst/build" >/dev/null && "$inst/build/consumer_shared" && "$inst/build/consumer_static" || failed=1
rm -rf "$inst"

echo "== C tests under ASan + UBSan"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DCKPTIO_SANITIZE=ON -DCMAKE_C_COMPILER=clang >/dev/null
cmake --build build-asan -j"$jobs" >/dev/null
(cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --output-on-failure -j"$jobs") || failed=1

echo "== wheel: sdist, the wheel built from it, auditwheel repair"
work=$(mktemp -d)
if wheel=$(scripts/build_wheel.sh "$work/dist") && scripts/install_wheel.sh "$wheel" "$work/venv"; then
    echo "== the wheel's binaries: no test double, no source path"
    "$work/venv/bin/python" -m zipfile -e "$wheel" "$work/unpacked"
    "$work/venv/bin/python" tests/check_shipped.py clean "$PWD" "$work"/unpacked/ckptio/_ckptio*.so \
        "$work/unpacked/ckptio/bin/ckptio" || failed=1
    echo "== Python tests against the installed wheel ($(basename "$wheel"))"
    # From an empty directory, with nothing of the checkout on sys.path: CKPTIO_TEST_INSTALLED makes
    # the tests take the package and the ckptio command from the new environment and check they did.
    # CKPTIO_TEST_BUILD_DIR only lends C test programs used as helpers (conftest.py).
    repo=$PWD
    mkdir "$work/run"
    (cd "$work/run" && env -u PYTHONPATH CKPTIO_TEST_INSTALLED=1 CKPTIO_TEST_BUILD_DIR="$repo/build" \
        PATH="$work/venv/bin:$PATH" "$work/venv/bin/python" -m pytest -q -p no:cacheprovider "$repo/tests/python") ||
        failed=1
else
    echo "building or installing the wheel failed"; failed=1
fi
rm -rf "$work"

if ls fuzz/fuzz_*.c >/dev/null 2>&1; then
    echo "== fuzzers (${CKPTIO_TEST_FUZZ_SECONDS:-30} s each)"
    cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DCKPTIO_FUZZ=ON -DCKPTIO_TESTS=OFF -DCMAKE_C_COMPILER=clang >/dev/null
    cmake --build build-fuzz -j"$jobs" >/dev/null
    for src in fuzz/fuzz_*.c; do
        name=$(basename "$src" .c)
        corpus="fuzz/corpus/${name#fuzz_}"
        work=$(mktemp -d)
        [ -d "$corpus" ] && cp -r "$corpus"/. "$work"/ 2>/dev/null || true
        echo "-- $name"
        if ! build-fuzz/"$name" -max_total_time="${CKPTIO_TEST_FUZZ_SECONDS:-30}" -print_final_stats=0 \
                -timeout=10 -rss_limit_mb=2048 "$work" 2>"$work.log"; then
            tail -40 "$work.log"; failed=1
        else
            grep -E "^Done|#[0-9]+.*DONE" "$work.log" | tail -1 || true
        fi
        rm -rf "$work" "$work.log"
    done
fi

if [ "$failed" != 0 ]; then
    echo "TESTS FAILED"
    exit 1
fi
echo "ALL TESTS PASSED"
