#!/usr/bin/env bash
# make_devbuild.sh - build everything here and pack what the GPU machine needs
# into .devbuild/ (git-ignored; carried with the device tool). The GPU machine
# has no Debian dev packages and no network, so it runs binaries built here:
# libckptio, the CLI, the GPU check program, the Python package (abi3
# extension, loads on its Python 3.12) and the shared libraries they need.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .devbuild
mkdir -p .devbuild/lib .devbuild/bin .devbuild/python
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DCKPTIO_GPU_TESTS=ON >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
cp -a build/libckptio.so* .devbuild/lib/
cp build/ckptio .devbuild/bin/
for t in build/gpu_check build/test_*; do [ -x "$t" ] && cp "$t" .devbuild/bin/; done
for l in liburing.so.2 libjansson.so.4 libzstd.so.1 libxxhash.so.0; do
    cp -L "$(ldconfig -p | awk -v l="$l" '$1==l{print $NF; exit}')" .devbuild/lib/
done
if [ -d python/ckptio ]; then
    CKPTIO_BUILD_DIR="$PWD/build" python3 setup.py -q build_ext --inplace >/dev/null 2>&1 || \
        CKPTIO_BUILD_DIR="$PWD/build" python3 -m pip install -q --no-build-isolation --target .devbuild/pytmp . >/dev/null
    cp -a python/ckptio .devbuild/python/
fi
du -sh .devbuild
