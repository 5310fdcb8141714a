"""scripts/check_layers.py: the library's directories depend one way and no source files call each
other in a loop; tools/ and the Python extension's C (python/src/) use only the public headers and
depend one way too (the extension from its converters up to its module); the Python package imports no
module in a loop. The checker runs on this checkout, and on small made-up trees to prove it catches what
it must (an upward #include, an upward call, a loop of files, a private header used by tools/, a ring
in tools/ or in the extension, an import loop)."""
import subprocess
import sys
from pathlib import Path

from conftest import REPO

CHECKER = REPO / "scripts" / "check_layers.py"


def run(tree):
    r = subprocess.run([sys.executable, str(CHECKER), str(tree)], capture_output=True, text=True)
    return r.returncode, r.stdout


def write(tree, files):
    for rel, text in files.items():
        p = Path(tree) / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


BASE = {
    "include/ckptio.h": "int ckptio_public(void);\n",
    "src/common/common_internal.h": '#include "ckptio.h"\nint ckptio__common(void);\n',
    "src/common/util.c": '#include "common_internal.h"\nint ckptio__common(void) { return 1; }\n',
    "src/io/io_internal.h": '#include "common_internal.h"\nint ckptio__io(void);\n',
    "src/io/file.c": '#include "io_internal.h"\nint ckptio__io(void) { return ckptio__common(); }\n',
    "src/engine/engine_internal.h": '#include "io_internal.h"\nint ckptio__engine(void);\n',
    "src/engine/engine.c": '#include "engine_internal.h"\n'
                           '/* ckptio__engine_helper() is named in a comment only */\n'
                           'static int helper(void) { return ckptio__io(); }\n'
                           'int ckptio__engine(void) { return helper(); }\n',
    "include/ckptio/core.h": "int ckptio_core(void);\n",
    "tools/cli.c": '#include "ckptio.h"\n#include "ckptio/core.h"\nint main(void) { return ckptio_public(); }\n',
    "python/src/ckpy_values.h": '#include "ckptio.h"\nint ckpy_raise(int st);\n',
    "python/src/ckpy_values.c": '#include "ckpy_values.h"\nint ckpy_raise(int st) { return st; }\n',
    "python/src/ckpy_engine.h": '#include "ckpy_values.h"\nint ckpy_engine_run(void);\n',
    "python/src/ckpy_engine.c": '#include "ckpy_engine.h"\nint ckpy_engine_run(void) { return ckpy_raise(1); }\n',
    "python/src/ckpy_module.c": '#include "ckpy_engine.h"\nint ckpy_init(void) { return ckpy_engine_run(); }\n',
    "python/ckptio/__init__.py": "from . import _api\n",
    "python/ckptio/_api.py": "from . import _model, _ckptio\n",
    "python/ckptio/_model.py": "from ._ckptio import E_FORMAT\n",
    "python/ckptio/_ckptio.pyi": "E_FORMAT: int\n",
}


def test_this_checkout_passes():
    rc, out = run(REPO)
    assert rc == 0, out
    assert "all downward, no files in a loop" in out


def test_a_clean_tree_passes(tmp_path):
    write(tmp_path, BASE)
    rc, out = run(tmp_path)
    assert rc == 0, out


def fails_with(tree, files, *expected):
    """The checker run on BASE with `files` over it fails and says each of `expected`."""
    write(tree, BASE)
    write(tree, files)
    rc, out = run(tree)
    assert rc == 1, out
    for line in expected:
        assert line in out


def test_upward_include_and_call_fail(tmp_path):
    fails_with(tmp_path, {"src/io/file.c": '#include "engine_internal.h"\n'
                                           'int ckptio__io(void) { return ckptio__engine(); }\n'},
               "src/io/file.c:1: io includes engine_internal.h of the higher layer engine",
               "src/io/file.c:2: io uses ckptio__engine() of src/engine/engine.c, a higher layer")


def test_a_loop_of_files_fails(tmp_path):
    fails_with(tmp_path, {
        "src/io/a.c": '#include "io_internal.h"\nint ckptio__a(int n) { return n ? ckptio__b(n - 1) : 0; }\n',
        "src/io/b.c": '#include "io_internal.h"\nint ckptio__b(int n) { return ckptio__c(n); }\n',
        "src/io/c.c": '#include "io_internal.h"\nint ckptio__c(int n) { return ckptio__a(n); }\n',
    }, "files in a loop: src/io/a.c:2 uses ckptio__b of src/io/b.c; src/io/b.c:2 uses ckptio__c of "
       "src/io/c.c; src/io/c.c:2 uses ckptio__a of src/io/a.c")


def test_tools_see_only_public_headers(tmp_path):
    fails_with(tmp_path, {"tools/cli.c": '#include "ckptio.h"\n#include "engine_internal.h"\n'
                                         'int main(void) { return 0; }\n'},
               "tools/cli.c:2: includes engine_internal.h, not a public header")


def test_an_unknown_directory_must_be_placed(tmp_path):
    fails_with(tmp_path, {"src/extra/x.c": "int ckptio__x(void) { return 0; }\n"},
               "src/extra/x.c: directory is not a layer")


def test_a_ring_in_tools_fails(tmp_path):
    fails_with(tmp_path, {
        "tools/cli.h": '#include "ckptio.h"\nvoid cli_error(void);\nvoid cli_clear(void);\n',
        "tools/cli_quote.c": '#include "cli.h"\nvoid cli_error(void) { cli_clear(); }\n',
        "tools/cli_progress.c": '#include "cli.h"\nvoid cli_clear(void) { cli_error(); }\n',
    }, "files in a loop: tools/cli_progress.c:2 uses cli_error of tools/cli_quote.c; "
       "tools/cli_quote.c:2 uses cli_clear of tools/cli_progress.c")


def test_the_extension_runs_from_its_converters_to_its_module(tmp_path):
    # An upward include and call from the converters: a loop, and the bottom broken.
    fails_with(tmp_path, {"python/src/ckpy_values.c": '#include "ckpy_engine.h"\n'
                                                       'int ckpy_raise(int st) { return st ? ckpy_engine_run() : 0; }\n'},
               "files in a loop: python/src/ckpy_engine.c:2 uses ckpy_raise of python/src/ckpy_values.c; "
               "python/src/ckpy_values.c:1 uses #include ckpy_engine.h of python/src/ckpy_engine.c",
               "python/src/ckpy_values.c:1: uses #include ckpy_engine.h of python/src/ckpy_engine.c: ckpy_values.c "
               "is the bottom of the extension")
    # A part that calls the module: the top broken.
    fails_with(tmp_path, {"python/src/ckpy_engine.c": '#include "ckpy_engine.h"\nint ckpy_init(void);\n'
                                                      'int ckpy_engine_run(void) { return ckpy_init(); }\n'},
               "python/src/ckpy_engine.c:3: uses ckpy_init of python/src/ckpy_module.c: ckpy_module.c is the top")


def test_the_extension_sees_only_public_headers(tmp_path):
    fails_with(tmp_path, {"python/src/ckpy_engine.c": '#include "ckpy_engine.h"\n#include "engine_internal.h"\n'
                                                      'int ckpy_engine_run(void) { return ckpy_raise(1); }\n'},
               "python/src/ckpy_engine.c:2: includes engine_internal.h, not a public header")


def test_an_import_loop_fails_even_inside_a_function(tmp_path):
    fails_with(tmp_path, {"python/ckptio/_model.py": "def load():\n    from ._api import load\n    return load\n"},
               "modules in an import loop: python/ckptio/_api.py:1 imports ckptio._model; "
               "python/ckptio/_model.py:2 imports ckptio._api")
