#!/usr/bin/env bash
# make_devbuild.sh - pack what the GPU machine needs into .devbuild/ (git-ignored).
#
# The GPU machine has no Debian dev packages and no network, so it runs what is
# built here: libckptio, the CLI, tests/gpu/gpu_check, the Python package (abi3
# extension: loads on that machine's Python 3.12) and the shared libraries they
# need. .devbuild/tree is a copy of the committed tree (HEAD) plus those builds,
# so helpers' uncommitted edits never reach a measurement.
#
# Then, on the GPU machine, from .devbuild/tree:
#   export LD_LIBRARY_PATH=$PWD/build-gpu/lib PYTHONPATH=$PWD/python
#   tests/gpu/run_gpu_checks.sh run                      # every byte compared, then bench_gpu.py
#   python3 -m pytest -q tests/python                    # the Python suite, CUDA tests included
#   build-gpu/ckptio bench --size 4G --dir /var/tmp      # host-memory bench
#   CKPTIO_LIB=$PWD/build-gpu/lib/libckptio.so DIR=/var/tmp/ckptio-bench python3 bench/bench_gpu.py
set -euo pipefail
cd "$(dirname "$0")/.."
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
git archive HEAD | tar -x -C "$src"
(
    cd "$src"
    tests/gpu/run_gpu_checks.sh build >/dev/null
    cmake --build build-gpu -j"$(nproc)" --target ckptio_cli >/dev/null
    cp -a build-gpu/libckptio.so.0* build-gpu/lib/
    CKPTIO_BUILD_DIR="$PWD/build-gpu" python3 setup.py -q build_ext --inplace >/dev/null
    rm -rf build-gpu/CMakeFiles
)
rm -rf .devbuild/tree
mkdir -p .devbuild
cp -a "$src" .devbuild/tree
du -sh .devbuild
