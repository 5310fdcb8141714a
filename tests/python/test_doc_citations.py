"""scripts/check_citations.py: every test the docs cite ("tests/FILE :: test_name", docs/RELIABILITY.md
and the other pages) exists, so that no rule is left backed by a test that was renamed, split or
deleted. Run on this checkout, and on made-up pages to prove it catches a missing file and a missing
test, in Python and in C."""
import subprocess
import sys
from pathlib import Path

from conftest import REPO

CHECKER = REPO / "scripts" / "check_citations.py"


def run(tree):
    r = subprocess.run([sys.executable, str(CHECKER), str(tree)], capture_output=True, text=True)
    return r.returncode, r.stdout


def test_every_cited_test_exists():
    rc, out = run(REPO)
    assert rc == 0, out
    assert "every file and test exists" in out


def test_a_missing_file_or_test_is_reported(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "tests" / "python").mkdir(parents=True)
    (tmp_path / "tests" / "python" / "test_a.py").write_text("def test_one():\n    pass\n")
    (tmp_path / "tests" / "test_b.c").write_text("static void test_two(void) {\n}\n")
    page = tmp_path / "docs" / "RELIABILITY.md"
    page.write_text("| rule | tests/python/test_a.py :: test_one, test_gone |\n"
                    "| rule | tests/test_b.c ::\n  test_two, test_three |\n"
                    "| rule | tests/python/test_renamed.py |\n"
                    "| rule | tests/test_b.c :: test_two, which checks ... |\n")
    rc, out = run(tmp_path)
    assert rc == 1, out
    assert "docs/RELIABILITY.md:1: cites tests/python/test_a.py :: test_gone, which it does not define" in out
    assert "docs/RELIABILITY.md:2: cites tests/test_b.c :: test_three, which it does not define" in out
    assert "docs/RELIABILITY.md:4: cites tests/python/test_renamed.py, which does not exist" in out
    assert "test_one" not in out and "test_two," not in out and "which," not in out
    page.write_text("tests/python/test_a.py :: test_one; tests/test_b.c :: test_two\n")
    assert run(tmp_path)[0] == 0
