"""The package as a user gets it.

- every module of python/ckptio imports, from the package's own directory, and every data file
  (type stubs, py.typed) is there with the checkout's bytes: a wheel that misses one fails here;
- the ``ckptio`` command and ``python -m ckptio`` run the CLI shipped in the package: same output,
  same exit status as the program itself;
- one version: include/ckptio/core.h's, the library's, the CLI's, ``ckptio.__version__`` and the installed
  distribution's metadata agree;
- installed mode (CKPTIO_TEST_INSTALLED=1: scripts/test.sh, scripts/gpu_wheel.sh): the package, the
  CLI and the distribution come from the virtual environment the wheel was installed into, nothing
  from the checkout (not python/, not build/), and no CUDA library was bundled.
"""
import importlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import ckptio
from conftest import CKPTIO_CLI, INSTALLED, REPO

SOURCE = REPO / "python" / "ckptio"
PACKAGE = Path(ckptio.__file__).resolve().parent
installed_only = pytest.mark.skipif(not INSTALLED, reason="installed mode only (CKPTIO_TEST_INSTALLED=1)")


def _source_files():
    """Files of python/ckptio that belong in the package: everything but the extension's C sources
    and what builds and Python leave there (the built module and CLI, bytecode)."""
    for path in sorted(SOURCE.rglob("*")):
        rel = path.relative_to(SOURCE)
        if not path.is_file() or rel.parts[0] == "bin" or "__pycache__" in rel.parts:
            continue
        if path.suffix in (".c", ".h", ".pyc", ".so") or ".so." in path.name:
            continue
        yield rel


MODULES = sorted(
    ".".join(("ckptio",) + rel.with_suffix("").parts).replace(".__init__", "")
    for rel in _source_files()
    if rel.suffix == ".py"
)
DATA_FILES = [rel for rel in _source_files() if rel.suffix != ".py"]


def test_the_checkout_has_what_these_tests_walk():
    # Guards the walk itself: an empty list would make the tests below pass on nothing.
    assert {"ckptio", "ckptio.__main__", "ckptio.dcp"} <= set(MODULES)
    assert Path("py.typed") in DATA_FILES and Path("_ckptio.pyi") in DATA_FILES


@pytest.mark.parametrize("name", MODULES)
def test_every_module_imports_from_the_package(name):
    if name.startswith("ckptio.dcp"):
        pytest.importorskip("torch")  # torch.distributed.checkpoint plugins
    module = importlib.import_module(name)
    rel = Path(*name.split(".")[1:])
    expected = PACKAGE / rel / "__init__.py" if (SOURCE / rel).is_dir() else PACKAGE / rel.with_suffix(".py")
    assert Path(module.__file__).resolve() == expected


@pytest.mark.parametrize("rel", DATA_FILES, ids=str)
def test_every_data_file_is_in_the_package(rel):
    installed = PACKAGE / rel
    assert installed.is_file(), f"{rel} is missing from {PACKAGE}"
    assert installed.read_bytes() == (SOURCE / rel).read_bytes()


def _header_version():
    text = (REPO / "include" / "ckptio" / "core.h").read_text()
    parts = [re.search(rf"^#define CKPTIO_VERSION_{k} (\d+)$", text, re.M).group(1) for k in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(parts)


def _packaged_cli():
    from ckptio.__main__ import executable

    path = executable()
    if not os.path.isfile(path):
        if INSTALLED:
            pytest.fail(f"the package has no CLI at {path}")
        pytest.skip("no CLI in python/ckptio/bin (configure build/ with -DCKPTIO_PYTHON=ON)")
    return path


def test_one_version_everywhere():
    version = _header_version()
    assert ckptio.__version__ == version
    if CKPTIO_CLI or INSTALLED:  # installed mode always has one (conftest.py)
        assert f"ckptio {version} (libckptio {version})" == subprocess.run(
            [CKPTIO_CLI, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    if INSTALLED:
        from importlib.metadata import version as dist_version

        assert dist_version("ckptio") == version


@pytest.mark.parametrize("args", [["--version"], ["verify", "/nonexistent/m.safetensors"], ["--no-such-option"],
                                  ["inspect", "--help"]], ids=lambda a: " ".join(a))
def test_command_and_python_m_run_the_shipped_cli(args):
    binary = _packaged_cli()
    runs = {
        "binary": subprocess.run([binary, *args], capture_output=True, text=True),
        "python -m ckptio": subprocess.run([sys.executable, "-m", "ckptio", *args], capture_output=True, text=True),
    }
    if INSTALLED:
        runs["ckptio command"] = subprocess.run([CKPTIO_CLI, *args], capture_output=True, text=True)
    want = runs["binary"]
    assert want.stdout or want.stderr
    for how, got in runs.items():
        assert (got.returncode, got.stdout, got.stderr) == (want.returncode, want.stdout, want.stderr), how


def _under(path, root):
    return Path(path).resolve().is_relative_to(Path(root).resolve())


@installed_only
def test_installed_package_and_cli_come_from_the_environment_not_the_checkout():
    from importlib.metadata import distribution

    for what, path in [("ckptio.__file__", ckptio.__file__), ("the ckptio command", CKPTIO_CLI),
                       ("the packaged CLI", _packaged_cli()),
                       ("the distribution", distribution("ckptio").locate_file("ckptio/__init__.py"))]:
        assert not _under(path, REPO), f"{what} is in the checkout: {path}"
        assert _under(path, sys.prefix), f"{what} is not in the virtual environment {sys.prefix}: {path}"
    for entry in sys.path:
        assert not (entry and (_under(entry, SOURCE.parent) or _under(entry, REPO / "build"))), entry
    # What the process has mapped: the extension from the package, no file from python/ or build*/.
    mapped = {line.split(None, 5)[5] for line in Path("/proc/self/maps").read_text().splitlines()
              if len(line.split(None, 5)) == 6 and line.split(None, 5)[5].startswith("/")}
    assert str(PACKAGE / "_ckptio.abi3.so") in mapped
    for path in mapped:
        rel = Path(path).relative_to(REPO).parts if _under(path, REPO) else ()
        assert not rel or not (rel[0] == "python" or rel[0].startswith("build")), path


@installed_only
def test_wheel_bundles_no_cuda_library():
    # The CUDA driver and cuFile are opened at run time (dlopen), from the machine.
    libs = PACKAGE.parent / "ckptio.libs"
    names = sorted(p.name for p in libs.iterdir()) if libs.is_dir() else []
    assert not [n for n in names if re.match(r"lib(cuda|cufile|nvidia)", n)], names
