"""The type stubs name everything the package offers: every name of the extension module is in
_ckptio.pyi, and every name of ckptio.__all__ in __init__.pyi (a name missing there is invisible to
type checkers and editors)."""
import ast
from pathlib import Path

import ckptio
import ckptio._ckptio as ext

PACKAGE = Path(ckptio.__file__).resolve().parent


def stub_names(path):
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.ImportFrom):
            names.update(a.asname or a.name for a in node.names)
    return names


def test_extension_stub_names_every_function_and_constant():
    public = {n for n in dir(ext) if not n.startswith("_")}
    assert {"dcp_write", "dcp_read", "dcp_verify", "dcp_metadata_objects", "DCP_ITEM_HASH"} <= public
    assert sorted(public - stub_names(PACKAGE / "_ckptio.pyi")) == []


def test_package_stub_names_all_of_all():
    assert sorted(set(ckptio.__all__) - stub_names(PACKAGE / "__init__.pyi")) == []
