#!/usr/bin/env bash
# bench_object_storage_gpu.sh - s3:// checkpoints loaded into GPU memory (bench/bench_object_storage.py --device
# cuda) against scripts/s3_server.sh's Swift on a GPU machine that has no network and no Debian packages to
# install: Swift and the peers travel as Python wheels, memcached as Debian packages unpacked in place.
#
#   bench/bench_object_storage_gpu.sh fetch DIR     on a machine with the network: into DIR, the wheels of
#       OpenStack Swift and its dependencies and of boto3 for CPython 3.12 on manylinux x86-64, and the Debian
#       packages of memcached and its libraries (Debian 12's, unpacked and run from DIR's copy)
#   bench/bench_object_storage_gpu.sh run DIR WHEEL [SIZE [REPS]]   on the GPU machine (python3: a Python 3.12 with
#       torch and safetensors): installs DIR's wheels into /tmp, the ckptio wheel WHEEL into a new virtual
#       environment (scripts/install_wheel.sh), starts the server (8 proxy and 4 object server processes, storage
#       under $CKPTIO_TEST_BENCH_DIR, default /var/tmp), runs the benchmark (default 2G, 3 repetitions), stops the
#       server. Results: $OUT/object_storage_gpu.json (default ./gpu-out). CKPTIO_TEST_BENCH_DEVICE=cpu runs the
#       host-memory workloads instead (loads and saves; CKPTIO_TEST_BENCH_ONLY picks the methods), results in
#       $OUT/object_storage.json.
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
fetch)
    [ $# -eq 2 ] || { echo "usage: $0 fetch DIR" >&2; exit 2; }
    dir=$2
    mkdir -p "$dir/whl" "$dir/deb"
    # Swift's and boto3's own dependencies; lxml, requests, urllib3 and python-dateutil are torch images' already.
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --abi cp312 --abi abi3 --abi none --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 \
        -d "$dir/whl" swift eventlet greenlet PasteDeploy xattr cffi pycparser pyeclib cryptography dnspython \
        boto3 botocore s3transfer jmespath
    (cd "$dir/deb" && apt-get download memcached libevent-2.1-7 libsasl2-2)
    du -sh "$dir"
    ;;
run)
    [ $# -ge 3 ] || { echo "usage: $0 run DIR WHEEL [SIZE [REPS]]" >&2; exit 2; }
    dir=$(cd "$2" && pwd)
    wheel=$(cd "$(dirname "$3")" && pwd)/$(basename "$3")
    size=${4:-2G}
    reps=${5:-3}
    # The host-memory workloads (saves too) on that machine's cores: CKPTIO_TEST_BENCH_DEVICE=cpu and, for the
    # methods whose wheels travel, CKPTIO_TEST_BENCH_ONLY (bench_object_storage.py's --only).
    device=${CKPTIO_TEST_BENCH_DEVICE:-cuda}
    only=${CKPTIO_TEST_BENCH_ONLY:-}
    work=${CKPTIO_TEST_BENCH_DIR:-/var/tmp}
    export OUT=${OUT:-$PWD/gpu-out}
    mkdir -p "$OUT"
    tmp=$(mktemp -d)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$tmp/site" "$dir"/whl/*.whl
    for f in "$dir"/deb/*.deb; do dpkg -x "$f" "$tmp/mc"; done
    mkdir -p "$tmp/bin"
    # memcached from the unpacked packages, with their libraries and nothing else's.
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$tmp/mc/usr/lib/x86_64-linux-gnu" \
        "$tmp/mc/usr/bin/memcached" >"$tmp/bin/memcached"
    chmod +x "$tmp/bin/memcached"
    PYTHON=python3 scripts/install_wheel.sh "$wheel" "$tmp/venv"
    export PATH="$tmp/site/bin:$tmp/bin:$PATH" PYTHONPATH="$tmp/site"
    CKPTIO_TEST_S3_PYTHON=$(command -v python3)
    # The state directory's name ends in the port, as the benchmark's count of the server's CPU expects.
    export CKPTIO_TEST_S3_PYTHON CKPTIO_TEST_S3_DIR="$work/ckptio-s3-$(id -u)-${CKPTIO_TEST_S3_PORT:-18480}"
    export CKPTIO_TEST_S3_WORKERS=${CKPTIO_TEST_S3_WORKERS:-8}
    export CKPTIO_TEST_S3_OBJECT_WORKERS=${CKPTIO_TEST_S3_OBJECT_WORKERS:-4}
    eval "$(scripts/s3_server.sh start)"
    trap 'scripts/s3_server.sh stop; rm -rf "$tmp"' EXIT
    # Unsigned payloads as every https:// endpoint gets them (BENCHMARKS.md "Object storage").
    CKPTIO_S3_SIGN_PAYLOAD=off AWS_REQUEST_CHECKSUM_CALCULATION=when_required PYTHONUNBUFFERED=1 \
        "$tmp/venv/bin/python" bench/bench_object_storage.py --device "$device" --dir "$work" --size "$size" \
        --reps "$reps" ${only:+--only "$only"} 2>&1 | tee "$OUT/object_storage_$device.log"
    ;;
*)
    echo "usage: $0 fetch DIR | run DIR WHEEL [SIZE [REPS]]" >&2
    exit 2
    ;;
esac
