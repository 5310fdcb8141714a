#!/usr/bin/env bash
# install_wheel.sh WHEEL VENV - install a ckptio wheel into a new virtual environment, as a user would.
#
# VENV is created anew (it must not exist) from the interpreter $PYTHON (default: .venv/bin/python,
# else python3), and WHEEL is installed with `pip install --no-index --no-deps`: nothing but the wheel,
# so a file the wheel lacks stays missing. The test dependencies (torch, numpy, safetensors, pytest...)
# are not installed again: VENV sees $PYTHON's site-packages through a .pth file placed after its own,
# so they come from where $PYTHON has them, while ckptio comes from VENV (and a .pth file in $PYTHON's
# site-packages, such as the development .venv's link to python/, is not read).
# Used by scripts/test.sh (CI) and scripts/gpu_wheel.sh (the GPU machine, Python 3.12, no network).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 2 ] || { echo "usage: $0 WHEEL VENV" >&2; exit 2; }
wheel=$1
venv=$2
if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
[ -f "$wheel" ] || { echo "install_wheel.sh: no wheel at $wheel" >&2; exit 1; }
[ ! -e "$venv" ] || { echo "install_wheel.sh: $venv exists; give a new directory" >&2; exit 1; }

"$PYTHON" -m venv "$venv"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$PYTHON" -c 'import site; print("\n".join(site.getsitepackages()))' >"$site/_ckptio_test_deps.pth"
"$venv/bin/python" -m pip install -q --no-index --no-deps --no-cache-dir --disable-pip-version-check "$wheel"
