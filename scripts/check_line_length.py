#!/usr/bin/env python3
"""check_line_length.py - ckptio's C lines are at most 120 columns.

Every .c and .h file under src/, include/, python/src/, tools/, tests/ and
fuzz/ (subdirectories included) is read; a line longer than 120 columns
(tabs expanded to 8) is a problem. Long lines are wrapped by hand in the
file's style: a long string literal becomes adjacent literals split at a
word boundary, so the text it holds stays the same.

Prints one line per long line (FILE:LINE: N columns) and exits 1 if there
is any; exits 0 with a count of the files and lines checked otherwise.

Usage: scripts/check_line_length.py [REPO]   (REPO defaults to this script's checkout)
"""
import os
import sys

LIMIT = 120
TREES = ("src", "include", os.path.join("python", "src"), "tools", "tests", "fuzz")


def c_files(repo):
    """Paths, relative to `repo` and sorted, of the .c and .h files in TREES."""
    out = []
    for tree in TREES:
        for dirpath, dirnames, names in os.walk(os.path.join(repo, tree)):
            dirnames.sort()
            out += [os.path.relpath(os.path.join(dirpath, n), repo) for n in names if n.endswith((".c", ".h"))]
    return sorted(out)


def main():
    repo = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    problems, nlines = [], 0
    files = c_files(repo)
    for rel in files:
        with open(os.path.join(repo, rel), encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, 1):
                nlines += 1
                width = len(line.rstrip("\r\n").expandtabs(8))
                if width > LIMIT:
                    problems.append(f"{rel}:{number}: {width} columns (at most {LIMIT})")
    for p in problems:
        print(p)
    if problems:
        print(f"check_line_length: {len(problems)} line(s) over {LIMIT} columns")
        return 1
    print(f"check_line_length: ok ({len(files)} files, {nlines} lines, none over {LIMIT} columns)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
