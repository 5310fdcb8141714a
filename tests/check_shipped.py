#!/usr/bin/env python3
"""check_shipped.py - what a shipped ckptio binary may contain.

  check_shipped.py exports LIBRARY HEADER...   (ctest "shipped_exports", on build/libckptio.so)
      `nm -D --defined-only LIBRARY` lists exactly the functions the public headers declare with
      CKPTIO_API (both ways: nothing exported that no header declares, no declaration the library
      lacks), every one named ckptio_* and documented: a comment right above its declaration, or
      above the group of declarations it belongs to. Prints how many each header declares.
  check_shipped.py headers CC INCLUDE_DIR      (ctest "shipped_headers")
      Each header of INCLUDE_DIR/ckptio/ compiles on its own, as C and as C++ (each includes what
      it uses); core.h, the stable one, without CKPTIO_EXPERIMENTAL; every other one only with it
      (without, it stops with an #error naming CKPTIO_EXPERIMENTAL); ckptio.h without it declares
      the core only, with it every header's functions.
  check_shipped.py clean SOURCE_DIR BINARY...  (ctest "shipped_clean"; scripts/test.sh on the wheel)
      no test double (the simulated GPU, I/O fault injection: tests/doubles) and no absolute path
      of a source file (or of SOURCE_DIR) in the binaries' bytes, debug information included.

Exit status 0 when every check holds, 1 with one line per violation otherwise.
"""
import re
import subprocess
import sys
from pathlib import Path

DECL = re.compile(r"^CKPTIO_API\b[^(;]*?\b(ckptio_\w+)\s*\(")


def declarations(header: Path):
    """{name: documented?} for each CKPTIO_API function of a header."""
    lines = header.read_text().splitlines()
    found = {}
    for i, line in enumerate(lines):
        m = DECL.match(line)
        if not m:
            continue
        # Walk up over the declarations of the same group (and their continuation lines) to the
        # line above the group: documented when that line closes a comment.
        j = i - 1
        while j >= 0 and lines[j].strip() and not lines[j].rstrip().endswith("*/") and \
                (DECL.match(lines[j]) or lines[j].startswith(" ") or lines[j].rstrip().endswith((",", "("))):
            j -= 1
        found[m.group(1)] = j >= 0 and lines[j].rstrip().endswith("*/")
    return found


def exports(library: str, headers):
    out = subprocess.run(["nm", "-D", "--defined-only", library], check=True, capture_output=True,
                         text=True).stdout
    exported = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "TtDdBbRrVvWw" and parts[1] != "A":
            exported.add(parts[2].split("@")[0])
    declared = {}
    for h in headers:
        for name, documented in declarations(Path(h)).items():
            if name in declared:
                yield f"{name}: declared in more than one public header"
            declared[name] = (h, documented)
    if not exported:
        yield f"{library}: exports nothing (nm -D found no defined symbol)"
    for name in sorted(exported - set(declared)):
        yield f"{library}: exports {name}, which no public header declares with CKPTIO_API"
    for name in sorted(set(declared) - exported):
        yield f"{declared[name][0]}: declares {name}, which {library} does not export"
    for name in sorted(exported):
        if not name.startswith("ckptio_") or name.startswith("ckptio__"):
            yield f"{library}: exports {name}: public names are ckptio_* (internal ones ckptio__*)"
    for name, (h, documented) in sorted(declared.items()):
        if not documented:
            yield f"{h}: {name} has no comment above its declaration (or its group's)"
    per_header = {}
    for name, (h, _) in declared.items():
        per_header[Path(h).name] = per_header.get(Path(h).name, 0) + 1
    counts = ", ".join(f"{h} {n}" for h, n in sorted(per_header.items()))
    stable = per_header.get(STABLE, 0)
    print(f"{len(exported)} exported functions, {len(declared)} declared in {len(headers)} public headers "
          f"({stable} stable, {len(declared) - stable} experimental): {counts}")


# The one header declared stable before 1.0 (include/ckptio.h says why the others opt in).
STABLE = "core.h"


def _compile(cc, include_dir, source, lang, defines):
    """(ok, stderr) of compiling `source` (text) as C or C++ against include_dir."""
    cmd = [cc, "-fsyntax-only", "-Wall", "-Wextra", "-Werror", f"-I{include_dir}"] + [f"-D{d}" for d in defines]
    cmd += ["-x", "c", "-std=c11"] if lang == "c" else ["-x", "c++", "-std=c++11"]
    r = subprocess.run(cmd + ["-"], input=source, capture_output=True, text=True)
    return r.returncode == 0, r.stderr


def headers(cc, include_dir):
    base = Path(include_dir)
    areas = sorted(p.name for p in (base / "ckptio").glob("*.h"))
    if STABLE not in areas:
        yield f"{base}/ckptio: no {STABLE}"
        return
    cxx = cc.replace("clang", "clang++") if "clang" in cc else cc.replace("gcc", "g++") if "gcc" in cc else "c++"
    for name in areas:
        src = f'#include "ckptio/{name}"\n'
        for lang, compiler in (("c", cc), ("c++", cxx)):
            ok, err = _compile(compiler, base, src, lang, ["CKPTIO_EXPERIMENTAL"])
            if not ok:
                yield f"ckptio/{name} does not compile on its own ({lang}): {err.strip()[:400]}"
        ok, err = _compile(cc, base, src, "c", [])
        if name == STABLE and not ok:
            yield f"ckptio/{name} needs CKPTIO_EXPERIMENTAL: {err.strip()[:400]}"
        if name != STABLE and (ok or "CKPTIO_EXPERIMENTAL" not in err):
            yield f"ckptio/{name} compiles without CKPTIO_EXPERIMENTAL (it is experimental: it must refuse)"
    # The umbrella: the core alone by default, everything when asked.
    core_fn = next(iter(declarations(base / "ckptio" / STABLE)))
    other = next(n for a in areas if a != STABLE for n in declarations(base / "ckptio" / a))
    for defines, want in (([], False), (["CKPTIO_EXPERIMENTAL"], True)):
        src = f"#include <ckptio.h>\nvoid *use(void);\nvoid *use(void) {{ (void){core_fn}; return (void *){other}; }}\n"
        ok, err = _compile(cc, base, src, "c", defines)
        if ok != want:
            yield (f"ckptio.h with {defines or 'no defines'}: {other} is "
                   f"{'declared' if ok else 'not declared'}: {err.strip()[:300]}")
    print(f"{len(areas)} headers of {base}/ckptio compile on their own (C, C++); only {STABLE} without "
          f"CKPTIO_EXPERIMENTAL")


# What only the test-only library (tests/doubles) may contain: its symbols and its messages.
DOUBLES = [b"ckptio__gpu_sim_", b"ckptio__io_inject", b"simulated", b"gpu_sim.c", b"io_inject.c"]


def clean(source_dir: str, binaries):
    # An absolute path ending in a source file: "/home/u/ckptio/src/io/file.c". The relative names that
    # -ffile-prefix-map gives ("./python/src/ckpy_values.c") start with a dot and are not one.
    absolute_source = re.compile(rb"(?<![\w.])/[\w.+-]+(?:/[\w.+-]+)*/(?:src|python|tools)/[\w/]+\.[ch]\b")
    root = str(Path(source_dir).resolve()).encode()
    for b in binaries:
        data = Path(b).read_bytes()
        for marker in DOUBLES:
            at = data.find(marker)
            if at >= 0:
                yield f"{b}: contains {marker.decode()!r} at byte {at}: a test double is in a shipped binary"
        at = data.find(root + b"/")
        if at >= 0:
            yield f"{b}: contains the source directory {root.decode()!r} at byte {at} (-ffile-prefix-map?)"
        m = absolute_source.search(data)
        if m:
            yield f"{b}: contains the absolute source path {m.group().decode(errors='replace')!r} at byte {m.start()}"
    print(f"{len(binaries)} binaries checked for test doubles and source paths")


def main(argv):
    if len(argv) >= 3 and argv[0] == "exports":
        problems = list(exports(argv[1], argv[2:]))
    elif len(argv) == 3 and argv[0] == "headers":
        problems = list(headers(argv[1], argv[2]))
    elif len(argv) >= 3 and argv[0] == "clean":
        problems = list(clean(argv[1], argv[2:]))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
