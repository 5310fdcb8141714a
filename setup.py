"""Build script of the ckptio Python package (python/ckptio).

The package is a CPython extension over libckptio's public C API, built
against the stable ABI (Py_LIMITED_API 3.8, an ``abi3`` module), so one
binary imports on every CPython >= 3.8. It links the STATIC library
``libckptio.a``:

* ``CKPTIO_BUILD_DIR=/path/to/cmake/build`` uses the library built there
  (scripts/setup.sh does this with build/);
* otherwise the library is configured and built here with CMake
  (Release, no tests) under the build_ext temporary directory.

liburing, jansson, zstd and xxhash are linked statically too when their
``.a`` files exist and are position-independent (``CKPTIO_STATIC_DEPS=0``:
never). The others are linked dynamically and their shared libraries are
copied next to the module (found through an ``$ORIGIN`` rpath), so the
package imports on a machine without them (``CKPTIO_BUNDLE_DEPS=0``: don't
copy).
"""

import os
import re
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
# What libckptio links, read from the ckptio.pc that CMake writes into the
# build directory (Requires.private / Libs.private); this list is the fallback.
DEFAULT_REQUIRES = ["liburing", "jansson", "libzstd", "libxxhash", "zlib"]
DEFAULT_LIBS = ["uring", "jansson", "zstd", "xxhash", "z", "pthread", "dl", "m"]
SYSTEM_LIBS = {"pthread", "dl", "m", "rt", "c"}
LIB_DIRS = ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib"]


def _link_deps(build_dir):
    """(pkg-config modules, library names) libckptio needs."""
    pc = os.path.join(build_dir, "ckptio.pc")
    if not os.path.exists(pc):
        return DEFAULT_REQUIRES, DEFAULT_LIBS
    requires, libs = [], []
    for line in open(pc, encoding="utf-8"):
        key, _, value = line.partition(":")
        if key.strip() == "Requires.private":
            requires = value.replace(",", " ").split()
        elif key.strip() == "Libs.private":
            libs = [tok[2:] for tok in value.split() if tok.startswith("-l")]
    return requires or DEFAULT_REQUIRES, libs or DEFAULT_LIBS


def _version():
    text = open(os.path.join(ROOT, "include", "ckptio.h"), encoding="utf-8").read()
    parts = [re.search(r"#define CKPTIO_VERSION_%s (\d+)" % k, text).group(1) for k in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(parts)


def _pkg_config(*args):
    try:
        out = subprocess.run(["pkg-config", *args], check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.strip()


def _links_into_shared(archive):
    """True if the archive's objects are position-independent (some distros
    ship non-PIC .a files, which cannot go into an extension module)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        cmd = ["cc", "-shared", "-o", os.path.join(tmp, "probe.so"), "-Wl,--whole-archive", archive,
               "-Wl,--no-whole-archive"]
        return subprocess.run(cmd, capture_output=True).returncode == 0


def _lib_dirs(requires):
    dirs = []
    for pkg in requires:
        d = _pkg_config("--variable=libdir", pkg)
        if d and d not in dirs:
            dirs.append(d)
    return dirs + [d for d in LIB_DIRS if d not in dirs]


def _shared_library(name, dirs):
    """(path, soname) of lib<name>.so, or None."""
    for d in dirs:
        path = os.path.join(d, "lib%s.so" % name)
        if os.path.exists(path):
            real = os.path.realpath(path)
            try:
                out = subprocess.run(["readelf", "-d", real], check=True, capture_output=True, text=True).stdout
            except (OSError, subprocess.CalledProcessError):
                return None
            m = re.search(r"Library soname: \[([^\]]+)\]", out)
            return (real, m.group(1)) if m else None
    return None


def _static_archive(name, dirs):
    """Path of a position-independent lib<name>.a, or None."""
    for d in dirs:
        path = os.path.join(d, "lib%s.a" % name)
        if os.path.exists(path):
            return path if _links_into_shared(path) else None
    return None


class BuildExt(build_ext):
    """Finds or builds libckptio.a, then links the extension against it."""

    def _library_dir(self):
        build_dir = os.environ.get("CKPTIO_BUILD_DIR")
        if build_dir:
            build_dir = os.path.abspath(build_dir)
            if not os.path.exists(os.path.join(build_dir, "libckptio.a")):
                sys.exit(
                    "ckptio: CKPTIO_BUILD_DIR=%s has no libckptio.a; build it first "
                    "(cmake -S . -B %s && cmake --build %s)" % (build_dir, build_dir, build_dir)
                )
            return build_dir
        if not shutil.which("cmake"):
            sys.exit("ckptio: building the C library needs cmake (or set CKPTIO_BUILD_DIR to a build directory)")
        build_dir = os.path.abspath(os.path.join(self.build_temp, "libckptio"))
        jobs = str(max(1, min(os.cpu_count() or 1, 8)))
        subprocess.check_call(
            ["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release", "-DCKPTIO_TESTS=OFF",
             "-DCKPTIO_WERROR=OFF"]
        )
        subprocess.check_call(["cmake", "--build", build_dir, "--target", "ckptio_static", "-j", jobs])
        return build_dir

    def build_extensions(self):
        build_dir = self._library_dir()
        static = os.environ.get("CKPTIO_STATIC_DEPS", "1") != "0"
        bundle = os.environ.get("CKPTIO_BUNDLE_DEPS", "1") != "0"
        objects = [os.path.join(build_dir, "libckptio.a")]
        libraries = []
        self._bundled = []
        requires, libs = _link_deps(build_dir)
        dirs = _lib_dirs(requires)
        for name in libs:
            if name in SYSTEM_LIBS:
                libraries.append(name)
                continue
            archive = _static_archive(name, dirs) if static else None
            if archive:
                objects.append(archive)
                continue
            libraries.append(name)
            shared = _shared_library(name, dirs) if bundle else None
            if shared:
                self._bundled.append(shared)
        for ext in self.extensions:
            ext.extra_objects = objects
            ext.libraries = libraries
            ext.depends = list(ext.depends) + objects[:1] + [os.path.join(ROOT, "include", "ckptio.h")]
            if self._bundled:
                # Dependencies linked dynamically travel next to the module
                # (like auditwheel's vendoring): found through $ORIGIN.
                ext.extra_link_args = list(ext.extra_link_args) + ["-Wl,-rpath,$ORIGIN"]
        super().build_extensions()
        for ext in self.extensions:
            path = self.get_ext_fullpath(ext.name)
            dests = {os.path.dirname(path)}
            if self.inplace or getattr(self, "editable_mode", False):
                # setuptools copies only the module itself into the source tree.
                dests.add(os.path.join(ROOT, "python", "ckptio"))
            needed = subprocess.run(["readelf", "-d", path], capture_output=True, text=True).stdout
            for real, soname in self._bundled:
                if "[%s]" % soname not in needed:
                    continue  # linked with --as-needed and not needed after all
                for dest in dests:
                    target = os.path.join(dest, soname)
                    if not os.path.exists(target) or os.path.getmtime(target) < os.path.getmtime(real):
                        shutil.copy2(real, target)


SOURCES = sorted(
    os.path.join("python", "ckptio", f)
    for f in os.listdir(os.path.join(ROOT, "python", "ckptio"))
    if f.startswith("_ckptio") and f.endswith(".c")
)

extension = Extension(
    "ckptio._ckptio",
    sources=SOURCES,
    include_dirs=[os.path.join(ROOT, "include")],
    define_macros=[("Py_LIMITED_API", "0x03080000")],
    py_limited_api=True,
    depends=[os.path.join("python", "ckptio", "_ckptio_internal.h")],
    extra_compile_args=["-std=gnu11", "-fvisibility=hidden", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers",
                        "-Wno-cast-function-type"],
    # Keep libckptio's and its dependencies' symbols private to the module.
    extra_link_args=["-Wl,--exclude-libs,ALL"],
)

setup(
    name="ckptio",
    version=_version(),
    description="Move tensor checkpoints between GPU/host memory and storage at disk speed "
    "(safetensors, torch.save, GDS file API)",
    long_description=open(os.path.join(ROOT, "docs", "PYTHON.md"), encoding="utf-8").read()
    if os.path.exists(os.path.join(ROOT, "docs", "PYTHON.md"))
    else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.8",
    package_dir={"": "python"},
    packages=["ckptio"],
    package_data={"ckptio": ["py.typed", "*.pyi", "*.so.*"]},
    ext_modules=[extension],
    cmdclass={"build_ext": BuildExt},
    extras_require={"torch": ["torch"], "numpy": ["numpy"]},
    options={"bdist_wheel": {"py_limited_api": "cp38"}},
    zip_safe=False,
)
