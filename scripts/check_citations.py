#!/usr/bin/env python3
"""check_citations.py - every test the docs cite exists.

docs/RELIABILITY.md and the other pages put each rule beside the test that
backs it, written "tests/FILE :: test_name" (several names separated by
commas), or a bare "tests/FILE" for a whole file. A renamed, split or
deleted test would leave the rule backed by nothing; this finds such
citations in README.md, BENCHMARKS.md and docs/*.md:

  - the file must exist;
  - each cited name must be defined in it: a Python test (def NAME, class
    NAME) or a C test function (NAME(...) followed by its body).

Prints one line per broken citation (page:line: what is missing) and exits 1
if there is any; exits 0 with a count otherwise.

Usage: scripts/check_citations.py [REPO]   (REPO defaults to this script's checkout)
"""
import os
import re
import sys

# "tests/x.py", "tests/python/test_x.py :: test_a, test_b" (the list may wrap to the next line; it
# ends at the first word that is not a test's name, as in "test_a, which ...").
CITATION = re.compile(r"(?<![\w/])(tests/[\w/.-]+\.(?:c|h|py|sh))(?:[ \t]*\n?[ \t]*::[ \t]*\n?[ \t]*"
                      r"(\w+(?:[ \t]*,[ \t]*\n?[ \t]*test\w*)*))?")


def pages(repo):
    out = [os.path.join(repo, n) for n in ("README.md", "BENCHMARKS.md") if os.path.isfile(os.path.join(repo, n))]
    docs = os.path.join(repo, "docs")
    if os.path.isdir(docs):
        out += [os.path.join(docs, n) for n in sorted(os.listdir(docs)) if n.endswith(".md")]
    return out


def defines(text, name, python):
    """Whether `text` (a test file) defines the test `name`."""
    if python:
        return re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{re.escape(name)}\b", text, re.M) is not None
    return re.search(rf"^[^\n;]*\b{re.escape(name)}\s*\([^;{{]*\)\s*\{{", text, re.M) is not None


def check(repo):
    problems, count = [], 0
    cache = {}
    for page in pages(repo):
        with open(page, encoding="utf-8") as f:
            text = f.read()
        rel_page = os.path.relpath(page, repo)
        for m in CITATION.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            path = os.path.join(repo, m.group(1))
            count += 1
            if path not in cache:
                cache[path] = open(path, encoding="utf-8", errors="replace").read() if os.path.isfile(path) else None
            body = cache[path]
            if body is None:
                problems.append(f"{rel_page}:{line}: cites {m.group(1)}, which does not exist")
                continue
            for name in re.split(r"[\s,]+", m.group(2) or ""):
                if name and not defines(body, name, path.endswith(".py")):
                    problems.append(f"{rel_page}:{line}: cites {m.group(1)} :: {name}, which it does not define")
    return problems, count


def main():
    repo = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    problems, count = check(repo)
    for p in problems:
        print(p)
    if problems:
        print(f"check_citations: {len(problems)} broken citation(s)")
        return 1
    print(f"check_citations: ok ({count} citations of tests, every file and test exists)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
