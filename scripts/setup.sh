#!/usr/bin/env bash
# setup.sh - install what ckptio needs on a fresh Debian machine and build it.
#
#   scripts/setup.sh            system packages + release build in build/
#   scripts/setup.sh --python   also the Python extension built in place (python/ckptio, by
#                               build/ with -DCKPTIO_PYTHON=ON) and a Python venv (.venv) that
#                               imports it from python/ (a development install: rebuild with
#                               `cmake --build build`), with the test and benchmark packages (torch,
#                               safetensors, numpy, pytest) and the wheel tools (build, auditwheel)
#   scripts/setup.sh --wheel-tools  system packages + a .venv with the wheel tools only
#                               (python/requirements-build.txt): what scripts/build_wheel.sh needs
#
# Safe to run again: installed packages are skipped, pip reuses its cache.
set -euo pipefail
cd "$(dirname "$0")/.."

want_python=0
want_wheel_tools=0
for arg in "$@"; do
    case "$arg" in
    --python) want_python=1 ;;
    --wheel-tools) want_wheel_tools=1 ;;
    *) echo "setup.sh: unknown option $arg" >&2; exit 2 ;;
    esac
done

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

# libcurl4-openssl-dev, libssl-dev: HTTP and SHA-256/HMAC for s3:// objects (src/objstore). The S3 server the
# tests run against (OpenStack Swift) is installed by scripts/s3_server.sh when it starts.
debian_packages=(build-essential cmake pkg-config liburing-dev libjansson-dev libzstd-dev libxxhash-dev zlib1g-dev
                 libcurl4-openssl-dev libssl-dev clang libclang-rt-dev python3 python3-venv python3-dev)
missing=()
for p in "${debian_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# python3 may come from elsewhere (pyenv); only ask apt for it if none is on PATH.
if command -v python3 >/dev/null; then
    missing=("${missing[@]/python3}")
    python3 -c 'import venv, sysconfig, os; assert os.path.exists(sysconfig.get_paths()["include"] + "/Python.h")' 2>/dev/null &&
        missing=("${missing[@]/python3-venv}") && missing=("${missing[@]/python3-dev}")
fi
missing=($(printf '%s\n' "${missing[@]}" | grep -v '^$' || true))
if [ ${#missing[@]} -gt 0 ]; then
    echo "== installing Debian packages: ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ "$want_wheel_tools" = 1 ] && [ "$want_python" = 0 ]; then
    # The wheel is built from the sdist in an isolated environment: no build/ needed here.
    [ -x .venv/bin/python ] || { echo "== creating .venv"; python3 -m venv --system-site-packages .venv; }
    echo "== installing the wheel tools (python/requirements-build.txt)"
    .venv/bin/python -m pip install -q --disable-pip-version-check -r python/requirements-build.txt
    exit 0
fi

echo "== building (build/)"
python_opt=()
if [ "$want_python" = 1 ]; then python_opt=(-DCKPTIO_PYTHON=ON); fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "${python_opt[@]}" >/dev/null
cmake --build build -j"$(nproc)" >/dev/null

if [ "$want_python" = 1 ]; then
    # --system-site-packages: reuse a torch that is already installed (it is
    # large); otherwise pip installs it from its cache into the venv.
    if [ ! -x .venv/bin/python ]; then
        echo "== creating .venv"
        python3 -m venv --system-site-packages .venv
    fi
    echo "== installing Python packages (python/requirements-test.txt, python/requirements-build.txt)"
    .venv/bin/python -m pip install -q --disable-pip-version-check -r python/requirements-test.txt \
        -r python/requirements-build.txt
    # The development install: .venv imports the package from python/ (module built in place above).
    # A copy installed in .venv (an older `pip install -e .`) would shadow it.
    site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    if ls -d "$site"/ckptio-*.dist-info >/dev/null 2>&1; then
        .venv/bin/python -m pip uninstall -q -y ckptio
    fi
    echo "$PWD/python" >"$site/_ckptio_dev.pth"
fi
