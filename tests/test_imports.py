"""Every import inside our functions resolves (GPU-only code paths import lazily; a rename would only show on GPU)."""

import ast
import importlib
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "sgl_sidp"


def lazy_imports():
    """(file, module, name) of every `from module import name` inside a function body of the package."""
    out = []
    for f in sorted(PKG.rglob("*.py")):
        tree = ast.parse(f.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and node.level == 0:
                    out += [(f.relative_to(PKG.parent).as_posix(), node.module, a.name) for a in node.names]
    return out


@pytest.mark.parametrize("where, module, name", lazy_imports(), ids=lambda x: str(x))
def test_lazy_import_resolves(where, module, name):
    if module.startswith("cuda."):
        pytest.importorskip(module)
    mod = importlib.import_module(module)
    assert hasattr(mod, name) or importlib.util.find_spec(f"{module}.{name}") is not None, f"{where}: {module}.{name}"
