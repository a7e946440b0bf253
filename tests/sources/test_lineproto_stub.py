"""The type stub of the compiled reader (``_lineproto.pyi``) against its C method table: mypy checks
every call into the extension by the stub alone, so a function added, renamed or dropped in
``_lineproto.c`` without the stub would be checked against an API that no longer exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SOURCES = Path(__file__).resolve().parents[2] / "layers" / "timelake" / "sources"
ARITY = {"METH_NOARGS": 0, "METH_O": 1}  # METH_VARARGS: the parse format says, not the flag


def _c_methods() -> dict[str, str]:
    table = re.search(r"static PyMethodDef methods\[\] = \{(.*?)\{NULL", (SOURCES / "_lineproto.c").read_text(), re.S)
    assert table is not None, "_lineproto.c has no method table named methods[]"
    return dict(re.findall(r'\{"(\w+)",\s*\w+,\s*(METH_\w+)', table.group(1)))


def _stub_functions() -> dict[str, ast.FunctionDef]:
    tree = ast.parse((SOURCES / "_lineproto.pyi").read_text())
    return {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}


def test_the_stub_declares_each_function_of_the_method_table():
    methods, stub = _c_methods(), _stub_functions()
    assert len(methods) >= 3, methods  # the table was read, not an empty match
    assert set(stub) == set(methods)
    for name, flag in methods.items():
        if flag in ARITY:
            args = stub[name].args
            assert len(args.posonlyargs) + len(args.args) == ARITY[flag], f"{name}: {flag}"
