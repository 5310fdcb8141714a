"""Unknown CKPTIO_* environment variables (a misspelt setting would be
ignored without a word): one warning each, naming the closest setting, when
the process creates its first engine and when the CLI runs
(ckptio_env_check); `import ckptio` alone (the CLI's Python launcher) stays
quiet."""
import os
import subprocess
import sys
from pathlib import Path

import ckptio
from conftest import CKPTIO_CLI, requires_cli


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTIO_") or k.startswith("CKPTIO_TEST_")}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(ckptio.__file__).parents[1]), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


def _python(code, *flags, **extra):
    return subprocess.run([sys.executable, *flags, "-c", code], capture_output=True, text=True,
                          env=_env(**extra), timeout=60)


USE = "import ckptio, torch; e = ckptio.Engine(); ckptio.save({'a': torch.ones(2)}); ckptio.Engine()"


def test_first_engine_warns_once_per_unknown_variable():
    r = _python(USE, CKPTIO_THREDS="4", CKPTIO_DIRECT="off")
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stderr.splitlines() if "Warning" in line]
    assert len(lines) == 1, r.stderr
    assert "RuntimeWarning: CKPTIO_THREDS is not a ckptio setting: did you mean CKPTIO_THREADS?" in lines[0]
    assert lines[0].startswith("<string>:1: "), "the warning points at the caller's line"


def test_import_alone_is_quiet():
    r = _python("import ckptio, ckptio.dcp", CKPTIO_THREDS="4")
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_known_variables_are_quiet():
    r = _python(USE, CKPTIO_THREADS="2", CKPTIO_READ_CACHE="off", CKPTIO_GPU_HUGE_SLOTS="off", CKPTIO_NVTX="0",
                CKPTIO_TEST_SOMETHING="1")
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_test_prefix_never_warns_a_misspelt_setting_still_does():
    """Tests and benchmarks name their variables CKPTIO_TEST_*: never a warning, whatever follows; a misspelt
    setting beside them still warns, and so do variables ckptio no longer reads."""
    r = _python(USE, CKPTIO_TEST_SOAK_SECONDS="5", CKPTIO_TEST_THREDS="4", CKPTIO_QUEUE_DEPHT="8",
                CKPTIO_GPU_MAP_WORKERS="2")
    assert r.returncode == 0, r.stderr
    lines = sorted(line.split("RuntimeWarning: ")[1] for line in r.stderr.splitlines() if "RuntimeWarning" in line)
    assert lines == ["CKPTIO_GPU_MAP_WORKERS is not a ckptio setting (docs/ENGINE.md lists them: CKPTIO_THREADS, "
                     "CKPTIO_DIRECT, ...)",
                     "CKPTIO_QUEUE_DEPHT is not a ckptio setting: did you mean CKPTIO_QUEUE_DEPTH?"], r.stderr


def test_warnings_as_errors_stop_the_engine():
    r = _python("import ckptio\ntry:\n    ckptio.Engine()\nexcept RuntimeWarning as w:\n    print('raised', w)",
                "-W", "error::RuntimeWarning", CKPTIO_THREDS="4")
    assert r.returncode == 0 and r.stdout.startswith("raised CKPTIO_THREDS"), (r.stdout, r.stderr)


def test_env_check_lists_every_unknown_name():
    code = "import warnings, ckptio._ckptio as c; print(c.env_check())"
    r = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True,
                       env=_env(CKPTIO_SYNCH="0", CKPTIO_FROB="1"), timeout=60)
    got = sorted(eval(r.stdout))
    assert got == ["CKPTIO_FROB is not a ckptio setting (docs/ENGINE.md lists them: CKPTIO_THREADS, "
                   "CKPTIO_DIRECT, ...)",
                   "CKPTIO_SYNCH is not a ckptio setting: did you mean CKPTIO_SYNC?"], r.stdout


@requires_cli
def test_cli_prints_the_warning(tmp_path):
    path = tmp_path / "m.safetensors"
    import torch
    ckptio.save({"a": torch.ones(2)}, path)
    r = subprocess.run([CKPTIO_CLI, "inspect", str(path)], capture_output=True, text=True,
                       env=_env(CKPTIO_BAKEND="pread"), timeout=60)
    assert r.returncode == 0
    assert r.stderr == "ckptio: warning: CKPTIO_BAKEND is not a ckptio setting: did you mean CKPTIO_BACKEND?\n"
    r = subprocess.run([CKPTIO_CLI, "inspect", str(path)], capture_output=True, text=True, env=_env(), timeout=60)
    assert r.returncode == 0 and r.stderr == ""


def test_the_warning_points_at_the_callers_line():
    """The first engine is made inside ckptio (here by save): the warning names the user's line, the one
    warnings.catch_warnings records and filters match, not ckptio's own file."""
    code = ("import warnings, ckptio, torch\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            "    ckptio.save({'a': torch.ones(2)})\n"
            "print(repr([(w.filename, w.lineno, w.category.__name__) for w in caught]))\n")
    r = _python(code, CKPTIO_THREDS="4")
    assert r.returncode == 0, r.stderr
    assert eval(r.stdout) == [("<string>", 4, "RuntimeWarning")], r.stdout
