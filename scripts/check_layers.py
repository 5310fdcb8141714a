#!/usr/bin/env python3
"""check_layers.py - proves that ckptio's source layers depend one way.

The library's directories form a stack (docs/ARCHITECTURE.md draws it):

    common -> objstore -> io -> engine -> gpu -> format -> ckpt

A file may use what its own directory or a lower one offers, never what a
higher one offers. The engine reaches the GPU layer only through tables it
defines itself (gpu_ops, the device transfer provider), which src/gpu fills
in; those are function pointers, so they do not show up as references here.

Checked, from the source text alone (no build needed):
  1. #include "x.h" in src/: x.h must live in the including file's directory
     or a lower one (include/*.h, the public headers, are allowed anywhere).
  2. References to functions and variables: a name used in a file of src/
     that another file defines with external linkage must be defined in the
     same directory or a lower one.
  3. No .c files of src/ reference each other in a loop (a pair that calls
     each other, or a longer ring): calls between files go one way, shared
     parts live in a lower file.
  4. tools/ and the Python extension's C (python/src/) include nothing of
     src/ (only the public headers of include/ and their own).
  5. Within tools/ and within python/src/, files depend one way: no loop of
     files, counting both calls and includes (including X.h is using X.c).
     In the extension the converters are the bottom (ckpy_values.c uses no
     other file of it) and the module the top (no file uses ckpy_module.c).
  6. The Python package (python/ckptio/) imports no module in a loop,
     counting imports inside functions too: shared pieces live in a lower
     module.
Prints every violation with file, line and what it reaches, and exits 1 if
there was any; exit 0 and a one-line summary otherwise.

Usage: scripts/check_layers.py [REPO]   (REPO defaults to this script's checkout)
"""
import ast
import os
import re
import sys

LAYERS = ["common", "objstore", "io", "engine", "gpu", "format", "ckpt"]
RANK = {name: i for i, name in enumerate(LAYERS)}

TOKEN = re.compile(
    r"""(?P<comment>/\*.*?\*/|//[^\n]*)
      | (?P<string>"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')
      | (?P<pp>^[ \t]*\#(?:\\\n|[^\n])*)
      | (?P<ident>[A-Za-z_]\w*)
      | (?P<punct>[{}()\[\];=,])
      | (?P<newline>\n)""",
    re.S | re.M | re.X,
)
INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.M)
KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "do", "else", "case", "goto"}


def tokens(text):
    """(kind, value, line) for the code of `text`: comments and string
    literals are dropped; identifiers inside #define bodies are kept as
    references (kind 'ref')."""
    line = 1
    for m in TOKEN.finditer(text):
        kind = m.lastgroup
        value = m.group(kind)
        if kind == "pp":
            body = re.sub(r"/\*.*?\*/|//[^\n]*|\"(?:\\.|[^\"\\\n])*\"", " ", value, flags=re.S)
            if re.match(r"\s*#\s*define\b", body):
                for ident in re.findall(r"[A-Za-z_]\w*", body):
                    yield ("ref", ident, line)
        elif kind in ("ident", "punct"):
            yield (kind, value, line)
        line += value.count("\n")


def scan(text):
    """Returns (defined, refs): the names `text` defines with external
    linkage, and {name: first line} of every identifier it uses."""
    defined, refs = set(), {}
    depth = 0
    outer = None  # what the open top-level braces hold: "body", "init" or "members"
    stmt = []  # top-level tokens since the last ';' or function body
    toks = list(tokens(text))
    for kind, value, line in toks:
        if kind == "ref":
            refs.setdefault(value, line)
        elif depth > 0:
            if value == "{":
                depth += 1
            elif value == "}":
                depth -= 1
                if depth == 0 and outer == "body":
                    stmt = []
            elif kind == "ident" and outer != "members":
                refs.setdefault(value, line)
        elif value == "{":
            words = [v for k, v, _ in stmt if k == "ident"]
            values = [v for _, v, _ in stmt]
            if stmt and values[-1] == ")":
                outer = "body"
                if "static" not in words and "typedef" not in words:
                    name = function_name(stmt)
                    if name:
                        defined.add(name)
            elif "=" in values:
                outer = "init"
                stmt.append((kind, value, line))  # the initializer stays part of its declaration
            else:
                outer = "members"  # struct, union or enum body: the declaration goes on after '}'
            depth += 1
        elif value == ";":
            top_level_data(stmt, defined, refs)
            stmt = []
        else:
            stmt.append((kind, value, line))
    return defined, refs


def function_name(stmt):
    """The name of the function whose declarator is `stmt` (ends with ')')."""
    level = 0
    for j in range(len(stmt) - 1, -1, -1):
        v = stmt[j][1]
        if v == ")":
            level += 1
        elif v == "(":
            level -= 1
            if level == 0:
                if j > 0 and stmt[j - 1][0] == "ident" and stmt[j - 1][1] not in KEYWORDS:
                    return stmt[j - 1][1]
                return None
    return None


def top_level_data(stmt, defined, refs):
    """A top-level declaration ended by ';': a variable with external linkage
    (no static/extern/typedef, not a prototype) is a definition; the names
    in its initializer are references."""
    words = [v for k, v, _ in stmt if k == "ident"]
    values = [v for _, v, _ in stmt]
    if "=" in values:
        for k, v, line in stmt[values.index("=") :]:
            if k == "ident":
                refs.setdefault(v, line)
    if not words or {"static", "extern", "typedef"} & set(words):
        return
    head = stmt[: values.index("=")] if "=" in values else stmt
    if any(v == "(" for _, v, _ in head):
        return  # a prototype (or a function pointer variable: rare, ignored)
    names = [v for k, v, _ in head if k == "ident"]
    if names and names[0] in ("struct", "union", "enum") and len(names) <= 2 and "=" not in values:
        return
    if names:
        defined.add(names[-1])


def file_cycles(uses):
    """One loop (a list of .c files, each using the next, the last the first)
    for every group of .c files that reach each other (Tarjan's strongly
    connected components)."""
    graph = {}
    for a, b in uses:
        if a.endswith(".c") and b.endswith(".c"):
            graph.setdefault(a, set()).add(b)
            graph.setdefault(b, set())
    index, low, stack, on_stack, groups = {}, {}, [], set(), []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                group = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    group.add(w)
                    if w == v:
                        break
                if len(group) > 1:
                    groups.append(group)
    cycles = []
    for group in groups:  # a shortest loop through the group's first file
        start = min(group)
        prev, frontier = {start: None}, [start]
        while frontier and start not in [b for a in frontier for b in graph[a] if b == start]:
            nxt = []
            for a in frontier:
                for b in sorted(graph[a] & group):
                    if b not in prev:
                        prev[b] = a
                        nxt.append(b)
            frontier = nxt
        last = next(a for a in sorted(prev) if start in graph[a] and a in group)
        path = [last]
        while prev[path[-1]] is not None:
            path.append(prev[path[-1]])
        cycles.append(path[::-1])
    return cycles


def loops(uses):
    """One problem line per loop of files in `uses` {(a, b): (what, line)}."""
    out = []
    for cycle in file_cycles(uses):
        steps = [f"{a}:{uses[(a, b)][1]} uses {uses[(a, b)][0]} of {b}" for a, b in zip(cycle, cycle[1:] + cycle[:1])]
        out.append("files in a loop: " + "; ".join(steps))
    return out


# The extension's bottom and top (rule 5).
EXT_DIR = os.path.join("python", "src")
EXT_BOTTOM, EXT_TOP = "ckpy_values.c", "ckpy_module.c"


def one_way(repo, top, public, problems):
    """Rules 4 and 5 for the C files of one directory (tools/ or python/src/):
    only public and own headers, no loop of files. Returns the uses {(a, b): (what, line)}."""
    base = os.path.join(repo, top)
    if not os.path.isdir(base):
        return {}
    names = sorted(n for n in os.listdir(base) if n.endswith((".c", ".h")))
    texts = {}
    for n in names:
        with open(os.path.join(base, n), encoding="utf-8", errors="replace") as f:
            texts[n] = f.read()
    own = {n for n in names if n.endswith(".h")}
    definer, refs, uses = {}, {}, {}
    for n, text in texts.items():
        defined, refs[n] = scan(text)
        if n.endswith(".c"):
            for name in defined:
                definer.setdefault(name, set()).add(n)

    def unit(n):  # a header stands for its .c file, when it has one
        c = n[:-2] + ".c"
        return c if n.endswith(".h") and c in texts else n

    for n, text in texts.items():
        for m in INCLUDE.finditer(text):
            inc, line = m.group(1), text.count("\n", 0, m.start()) + 1
            if inc in public or os.path.basename(inc) in public:
                continue
            if os.path.basename(inc) not in own:
                problems.append(f"{top}/{n}:{line}: includes {inc}, not a public header")
            elif unit(os.path.basename(inc)).endswith(".c") and unit(os.path.basename(inc)) != unit(n):
                uses.setdefault((unit(n), unit(os.path.basename(inc))), (f"#include {inc}", line))
        for name, line in refs[n].items():
            homes = definer.get(name)
            if homes and len(homes) == 1 and unit(n) not in homes:
                uses.setdefault((unit(n), next(iter(homes))), (name, line))
    graph_uses = {(os.path.join(top, a), os.path.join(top, b)): v for (a, b), v in uses.items()}
    problems += loops(graph_uses)
    if top == EXT_DIR and EXT_TOP in texts:
        for (a, b), (what, line) in sorted(uses.items()):
            if a == EXT_BOTTOM:
                problems.append(f"{top}/{a}:{line}: uses {what} of {top}/{b}: {EXT_BOTTOM} is the bottom of the "
                                "extension and uses no other file of it")
            if b == EXT_TOP:
                problems.append(f"{top}/{a}:{line}: uses {what} of {top}/{b}: {EXT_TOP} is the top of the "
                                "extension and no file uses it")
    return graph_uses


def python_imports(repo, problems):
    """Rule 6: the modules of python/ckptio and the modules each imports
    (at the top or inside a function); a loop among them is a problem.
    Returns the number of import edges."""
    root = os.path.join(repo, "python")
    pkg = os.path.join(root, "ckptio")
    if not os.path.isdir(pkg):
        return 0
    modules = {}
    for dirpath, _, names in os.walk(pkg):
        for n in names:
            path = os.path.join(dirpath, n)
            stem, ext = os.path.splitext(os.path.relpath(path, root))
            if ext not in (".py", ".so", ".pyi"):
                continue
            # "ckptio/_ckptio.abi3.so" and its stub are the extension module ckptio._ckptio: a leaf.
            name = stem.split(".")[0].replace(os.sep, ".")
            name = name[: -len(".__init__")] if name.endswith(".__init__") else name
            if ext == ".py" or name not in modules:
                modules[name] = path if ext == ".py" else None
    edges = {}
    for mod, path in modules.items():
        if path is None:
            continue
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        package = mod.split(".") if path.endswith("__init__.py") else mod.split(".")[:-1]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                found = [f"{target}.{a.name}" if f"{target}.{a.name}" in modules else target for a in node.names]
            elif isinstance(node, ast.Import):
                found = [a.name for a in node.names]
            else:
                continue
            for t in found:
                if t in modules and t != mod:
                    edges.setdefault((mod, t), node.lineno)
    rel = {m: os.path.relpath(p, repo) if p else m for m, p in modules.items()}
    for cycle in file_cycles({(f"{a}.c", f"{b}.c"): 0 for a, b in edges}):
        mods = [c[:-2] for c in cycle]
        steps = [f"{rel[a]}:{edges[(a, b)]} imports {b}" for a, b in zip(mods, mods[1:] + mods[:1])]
        problems.append("modules in an import loop: " + "; ".join(steps))
    return len(edges)


def layer_of(rel):
    """'src/io/file.c' -> 'io'; None outside src/<dir>/."""
    parts = rel.split("/")
    return parts[1] if len(parts) == 3 and parts[0] == "src" else None


def main():
    repo = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    problems = []
    src_files = []
    for dirpath, _, names in os.walk(os.path.join(repo, "src")):
        for n in names:
            if n.endswith((".c", ".h")):
                src_files.append(os.path.relpath(os.path.join(dirpath, n), repo))
    src_files.sort()
    public = set()  # the public headers, as included: "ckptio.h", "ckptio/core.h"
    for dirpath, _, names in os.walk(os.path.join(repo, "include")):
        for n in names:
            if n.endswith(".h"):
                public.add(os.path.relpath(os.path.join(dirpath, n), os.path.join(repo, "include")))

    header_home = {}
    for rel in src_files:
        layer = layer_of(rel)
        if layer is None or layer not in RANK:
            problems.append(f"{rel}: directory is not a layer; add it to LAYERS in scripts/check_layers.py")
            continue
        if rel.endswith(".h"):
            header_home[os.path.basename(rel)] = layer

    texts = {}
    for rel in src_files:
        with open(os.path.join(repo, rel), encoding="utf-8", errors="replace") as f:
            texts[rel] = f.read()

    # 1. includes
    nincludes = 0
    for rel, text in texts.items():
        layer = layer_of(rel)
        if layer not in RANK:
            continue
        for m in INCLUDE.finditer(text):
            name = os.path.basename(m.group(1))
            line = text.count("\n", 0, m.start()) + 1
            nincludes += 1
            if (m.group(1) in public or name in public) and name not in header_home:
                continue
            home = header_home.get(name)
            if home is None:
                problems.append(f"{rel}:{line}: includes \"{m.group(1)}\", which is neither in src/ nor include/")
            elif RANK[home] > RANK[layer]:
                problems.append(f"{rel}:{line}: {layer} includes {name} of the higher layer {home}")

    # 2. and 3. references between files
    definer = {}
    scanned = {}
    for rel, text in texts.items():
        if layer_of(rel) not in RANK:
            continue
        defined, refs = scan(text)
        scanned[rel] = refs
        if rel.endswith(".c"):
            for name in defined:
                definer.setdefault(name, set()).add(rel)
    uses = {}  # (file, file) -> (name, line)
    for rel, refs in scanned.items():
        layer = layer_of(rel)
        for name, line in refs.items():
            homes = definer.get(name)
            if not homes or rel in homes or len(homes) != 1:
                continue
            home = next(iter(homes))
            uses.setdefault((rel, home), (name, line))
            if RANK[layer_of(home)] > RANK[layer]:
                problems.append(f"{rel}:{line}: {layer} uses {name}() of {home}, a higher layer")
    problems += loops(uses)

    # 4. and 5. tools/ and the extension's C: public headers only, one way
    side_uses = {}
    for top in ("tools", EXT_DIR):
        side_uses.update(one_way(repo, top, public, problems))
    # 6. the Python package imports one way
    nimports = python_imports(repo, problems)

    for p in problems:
        print(p)
    nedges = len({(layer_of(a), layer_of(b)) for a, b in uses})
    if problems:
        print(f"check_layers: {len(problems)} problem(s)")
        return 1
    print(f"check_layers: ok ({len(src_files)} files, {nincludes} includes, {len(uses)} file-to-file uses "
          f"over {nedges} directory pairs, all downward, no files in a loop; tools/ and python/src/: "
          f"{len(side_uses)} uses one way; python/ckptio: {nimports} imports, no loop)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
