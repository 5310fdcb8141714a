"""scripts/check_line_length.py: no C line of src/, include/, python/src/, tools/, tests/ or fuzz/ is longer
than 120 columns. Run on this checkout, and on a made-up tree to prove it names each long line (in a
subdirectory and in a header too, a tab counted to its stop) and leaves alone a line of exactly 120 columns
and files that are not C."""
import subprocess
import sys

from conftest import REPO
from test_layers import write

CHECKER = REPO / "scripts" / "check_line_length.py"


def run(tree):
    r = subprocess.run([sys.executable, str(CHECKER), str(tree)], capture_output=True, text=True)
    return r.returncode, r.stdout


def test_this_checkout_passes():
    rc, out = run(REPO)
    assert rc == 0, out
    assert "none over 120 columns" in out


def test_each_long_line_is_named(tmp_path):
    fits = "x" * 120
    write(tmp_path, {
        "src/io/a.c": f"int a;\n{fits}\n{'y' * 121}\n",
        "include/ckptio/b.h": "\t" + "z" * 113 + "\n",  # the tab reaches column 8: 121 columns
        "tests/gpu/c.c": f"{fits}\n",
        "python/src/d.c": f"/* {'w' * 200} */\n",
        "tools/e.py": "v" * 200 + "\n",
        "bench/f.c": "u" * 200 + "\n",
    })
    rc, out = run(tmp_path)
    assert rc == 1, out
    assert out.splitlines() == [
        "include/ckptio/b.h:1: 121 columns (at most 120)",
        "python/src/d.c:1: 206 columns (at most 120)",
        "src/io/a.c:3: 121 columns (at most 120)",
        "check_line_length: 3 line(s) over 120 columns",
    ]
    write(tmp_path, {"src/io/a.c": f"int a;\n{fits}\n", "include/ckptio/b.h": "\n", "python/src/d.c": "\n"})
    rc, out = run(tmp_path)
    assert rc == 0, out
