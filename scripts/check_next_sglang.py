"""Check a newer SGLang release against the overlay's hook table, by reading its wheel's sources (no install).

The overlay is pinned to SGLang 0.5.17 and hooks SGLang symbols by dotted path (`sgl_sidp.hooks`: `HOOKS`,
`TORCH_HOOKS`, `USED_SYMBOLS`). A newer SGLang may need a torch the GPU hosts cannot run, so it cannot be installed
here to try; this script answers the question statically instead. It gets the newer wheel (the newest release on
PyPI unless told otherwise), opens it as a zip, parses the modules with `ast` (nothing of it is installed or
imported), resolves every symbol of the hook table (module -> class -> method or function, following imports,
re-exports, simple assignments and base classes), and compares its parameters (names, order, kinds, whether each has
a default) with the same symbol in the installed, pinned SGLang, read the same way. Instance attributes are found
where a method assigns `self.<name>` (or as class-level fields).

The result is a markdown report: the version and wheel checked (file name and sha256), then one table row per
symbol: the same, parameters changed (old -> new), or missing (with same-named definitions elsewhere in the package
as candidates for where it moved); and a section on the accessors both versions offer. The report is the result:
the exit code is 0 whatever it finds. Exit code 2, with one line on stderr, means the wheel (or the pinned tree)
could not be got or parsed.

Usage (outside the default test run; needs PyPI unless --wheel is given):
    python scripts/check_next_sglang.py [--version X.Y.Z | --wheel PATH] [--out FILE]
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import datetime
import hashlib
import importlib.metadata
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from pathlib import Path
from typing import Callable, Iterable, Optional

PYPI_JSON = "https://pypi.org/pypi/sglang/json"
PACKAGE = "sglang"


class CheckError(Exception):
    """The wheel or a tree could not be got or parsed (exit code 2)."""


# ------------------------------------------------------------------------------------------------------------ trees
class SourceTree:
    """The Python sources of one SGLang package tree, read as text and parsed with `ast`, never imported.

    Args:
        label: how the report names it ("0.5.17 (installed)", "0.5.23").
        files: relative path ("sglang/srt/x.py") -> a function returning its bytes.
    """

    def __init__(self, label: str, files: dict[str, Callable[[], bytes]]):
        self.label = label
        self._files = files
        self._text: dict[str, str] = {}
        self._ast: dict[str, ast.Module] = {}
        self._def_index: Optional[dict[str, set[str]]] = None
        self._dirs: Optional[set[str]] = None

    @classmethod
    def from_zip(cls, zf: zipfile.ZipFile, label: str) -> "SourceTree":
        """The `sglang/` sources of an open wheel (also those under `*.data/purelib|platlib/`)."""
        files = {}
        for name in zf.namelist():
            rel = re.sub(r"^[^/]+\.data/(purelib|platlib)/", "", name)
            if rel.startswith(PACKAGE + "/") and rel.endswith(".py"):
                files[rel] = (lambda n=name: zf.read(n))
        if not files:
            raise CheckError(f"no {PACKAGE}/ Python sources in {zf.filename or 'the wheel'}")
        return cls(label, files)

    @classmethod
    def from_dir(cls, site: Path, label: str) -> "SourceTree":
        """The sources of an installed package: `site` is the directory holding `sglang/`."""
        root = Path(site) / PACKAGE
        if not (root / "__init__.py").is_file():
            raise CheckError(f"no {PACKAGE} package under {site}")
        files = {}
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for f in filenames:
                if f.endswith(".py"):
                    p = Path(dirpath) / f
                    files[p.relative_to(site).as_posix()] = (lambda p=p: p.read_bytes())
        return cls(label, files)

    def module_file(self, module: str) -> Optional[str]:
        """The relative path of `module` ("a.b" -> "a/b.py" or "a/b/__init__.py"), or None."""
        base = module.replace(".", "/")
        for p in (base + ".py", base + "/__init__.py"):
            if p in self._files:
                return p
        return None

    def is_module(self, module: str) -> bool:
        """A module, a package, or a directory of modules without `__init__.py` (a namespace package)."""
        if self._dirs is None:
            self._dirs = {rel.rsplit("/", i)[0] for rel in self._files for i in range(1, rel.count("/") + 1)}
        return self.module_file(module) is not None or module.replace(".", "/") in self._dirs

    def is_package(self, module: str) -> bool:
        return (module.replace(".", "/") + "/__init__.py") in self._files

    def text(self, rel: str) -> str:
        if rel not in self._text:
            self._text[rel] = self._files[rel]().decode("utf-8", errors="replace")
        return self._text[rel]

    def parse(self, module: str) -> Optional[ast.Module]:
        """The module's AST, or None when the tree has no such module.

        Raises:
            CheckError: the module's source does not parse.
        """
        rel = self.module_file(module)
        if rel is None:
            return None
        if rel not in self._ast:
            try:
                self._ast[rel] = ast.parse(self.text(rel), filename=rel)
            except (SyntaxError, ValueError) as e:
                raise CheckError(f"{self.label}: cannot parse {rel}: {e}") from e
        return self._ast[rel]

    def modules(self) -> Iterable[tuple[str, str]]:
        """(module name, relative path) of every module."""
        for rel in sorted(self._files):
            mod = rel[:-3].replace("/", ".")
            yield (mod[: -len(".__init__")] if mod.endswith(".__init__") else mod), rel

    def _names_index(self) -> dict[str, set[str]]:
        """def/class name -> the files that define it (one regular-expression pass over every file, cached)."""
        if self._def_index is None:
            pat = re.compile(r"^[ \t]*(?:async[ \t]+)?(?:def|class)[ \t]+(\w+)", re.M)
            index: dict[str, set[str]] = {}
            for _, rel in self.modules():
                for name in pat.findall(self.text(rel)):
                    index.setdefault(name, set()).add(rel)
            self._def_index = index
        return self._def_index

    def defs_named(self, name: str) -> list[tuple[str, str, int]]:
        """Every top-level function or class, and every method, called `name`: (qualname, kind, line).

        Only the files that define something of that name are parsed; files that do not parse are skipped.
        """
        files = self._names_index().get(name, set())
        out = []
        for mod, rel in self.modules():
            if rel not in files:
                continue
            try:
                tree = self.parse(mod)
            except CheckError:
                continue
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
                    kind = "class" if isinstance(node, ast.ClassDef) else "function"
                    out.append((f"{mod}.{name}", kind, node.lineno))
                if isinstance(node, ast.ClassDef):
                    for sub in node.body:
                        if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) and sub.name == name:
                            out.append((f"{mod}.{node.name}.{name}", "method", sub.lineno))
        return out

    def fields_named(self, name: str) -> list[tuple[str, int]]:
        """Every top-level class that declares an annotated field `name`: (module.Class, line)."""
        out = []
        for mod, rel in self.modules():
            text = self.text(rel)
            if f"{name}:" not in text and f"{name} :" not in text:
                continue
            try:
                tree = self.parse(mod)
            except CheckError:
                continue
            for node in tree.body:
                if isinstance(node, ast.ClassDef):
                    for sub in node.body:
                        if (isinstance(sub, ast.AnnAssign) and isinstance(sub.target, ast.Name)
                                and sub.target.id == name):
                            out.append((f"{mod}.{node.name}", sub.lineno))
        return out


def installed_tree(site: Optional[str] = None) -> tuple[SourceTree, str, str]:
    """The installed (pinned) SGLang as a `SourceTree`, its version and its directory; found without importing it."""
    if site is None:
        try:
            dist = importlib.metadata.distribution(PACKAGE)
        except importlib.metadata.PackageNotFoundError as e:
            raise CheckError(f"{PACKAGE} is not installed in {sys.executable}'s environment") from e
        version, site_path = dist.version, Path(dist.locate_file(""))
    else:
        site_path, version = Path(site), "?"
        init = site_path / PACKAGE / "version.py"
        if init.is_file():
            m = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", init.read_text())
            version = m.group(1) if m else "?"
    return SourceTree.from_dir(site_path, f"{version} (installed)"), version, str(site_path / PACKAGE)


# ------------------------------------------------------------------------------------------------------ resolution
@dataclasses.dataclass(frozen=True, eq=False)
class Mod:
    name: str


@dataclasses.dataclass(frozen=True, eq=False)
class Cls:
    module: str
    node: ast.ClassDef
    qualname: str


@dataclasses.dataclass(frozen=True, eq=False)
class Func:
    module: str
    node: ast.AST  # FunctionDef or AsyncFunctionDef
    qualname: str
    owner: Optional[Cls] = None


@dataclasses.dataclass(frozen=True, eq=False)
class Value:
    """A name bound to something other than a def or an import (a constant, an enum member, a field)."""

    module: str
    node: ast.AST
    qualname: str


@dataclasses.dataclass(frozen=True, eq=False)
class External:
    """A name imported from outside the tree (torch, typing, ...)."""

    name: str


Ref = Mod | Cls | Func | Value | External


@dataclasses.dataclass(frozen=True)
class Param:
    name: str
    kind: str  # "posonly", "pos", "vararg", "kwonly", "varkw"
    default: bool = False


def _is_type_checking(test: ast.AST) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _bindings(body: list[ast.stmt], name: str) -> list[ast.stmt]:
    """Statements of `body` (and of the if/try/with blocks in it, not of functions) that bind `name`, in order.

    Bindings in `except` handlers (fallbacks) come first, so that the last element is the one that runs when the
    code runs; those under `if TYPE_CHECKING:` are left out (they do not exist at run time); star imports are
    included (they may bind it).
    """
    primary: list[ast.stmt] = []
    fallback: list[ast.stmt] = []

    def binds(target: ast.AST) -> bool:
        if isinstance(target, ast.Name):
            return target.id == name
        if isinstance(target, (ast.Tuple, ast.List)):
            return any(binds(e) for e in target.elts)
        if isinstance(target, ast.Starred):
            return binds(target.value)
        return False

    def walk(stmts: list[ast.stmt], fb: bool) -> None:
        out = fallback if fb else primary
        for s in stmts:
            if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if s.name == name:
                    out.append(s)
            elif isinstance(s, ast.Assign):
                if any(binds(t) for t in s.targets):
                    out.append(s)
            elif isinstance(s, ast.AnnAssign):
                if binds(s.target):
                    out.append(s)
            elif isinstance(s, ast.ImportFrom):
                if any((a.asname or a.name) == name or a.name == "*" for a in s.names):
                    out.append(s)
            elif isinstance(s, ast.Import):
                if any((a.asname or a.name.split(".")[0]) == name for a in s.names):
                    out.append(s)
            elif isinstance(s, ast.If):
                if not _is_type_checking(s.test):
                    walk(s.body, fb)
                walk(s.orelse, fb)
            elif isinstance(s, (ast.Try, getattr(ast, "TryStar", ast.Try))):
                walk(s.body, fb)
                for h in s.handlers:
                    walk(h.body, True)
                walk(s.orelse, fb)
                walk(s.finalbody, fb)
            elif isinstance(s, (ast.With, ast.AsyncWith)):
                walk(s.body, fb)

    walk(body, False)
    return fallback + primary


def _in_package(module: str) -> bool:
    return module == PACKAGE or module.startswith(PACKAGE + ".")


def _rewraps(node: ast.stmt, name: str) -> bool:
    """`name = call(...)` whose arguments mention `name` itself (a decorator applied by hand, `msgspec.defstruct`)."""
    value = getattr(node, "value", None)
    return isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(value, ast.Call) and any(
        isinstance(n, ast.Name) and n.id == name for n in ast.walk(value))


class Resolver:
    """Resolves dotted SGLang paths in one `SourceTree`, statically."""

    def __init__(self, tree: SourceTree):
        self.tree = tree
        self._active: set[tuple] = set()

    # -- modules
    def _abs_module(self, module: str, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        pkg = module if self.tree.is_package(module) else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            pkg = pkg.rpartition(".")[0]
        return f"{pkg}.{node.module}" if node.module else pkg

    def _module_ref(self, name: str) -> Optional[Ref]:
        if self.tree.is_module(name):
            return Mod(name)
        return None if _in_package(name) else External(name)

    def lookup_module(self, module: str, name: str) -> Optional[Ref]:
        """What `name` is in module `module`'s namespace (or its submodule of that name), or None."""
        key = ("m", module, name)
        if key in self._active:
            return None
        tree = self.tree.parse(module)
        self._active.add(key)
        rewrapped = None
        try:
            for node in reversed(_bindings(tree.body, name) if tree is not None else []):
                if _rewraps(node, name):  # `X = make(..., X, ...)`: X keeps what the earlier binding defined
                    rewrapped = rewrapped or node
                    continue
                ref = self._from_binding(module, node, name, None)
                if ref is not None:
                    return ref
        finally:
            self._active.discard(key)
        if rewrapped is not None:
            return Value(module, rewrapped, f"{module}.{name}")
        sub = f"{module}.{name}"
        return Mod(sub) if self.tree.is_module(sub) else None

    def _from_binding(self, module: str, node: ast.stmt, name: str, cls: Optional[Cls]) -> Optional[Ref]:
        prefix = cls.qualname if cls else module
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return Func(module, node, f"{prefix}.{name}", cls)
        if isinstance(node, ast.ClassDef):
            return Cls(module, node, f"{prefix}.{name}")
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            value = node.value
            single = isinstance(node, ast.AnnAssign) or (
                len(node.targets) == 1 and isinstance(node.targets[0], ast.Name))
            if single and isinstance(value, (ast.Name, ast.Attribute)):
                ref = self.resolve_expr(module, value, cls)
                if ref is not None and not isinstance(ref, External):
                    return ref
            return Value(module, node, f"{prefix}.{name}")
        if isinstance(node, ast.ImportFrom):
            base = self._abs_module(module, node)
            for a in node.names:
                if a.name == "*":
                    if self.tree.is_module(base):
                        ref = self.lookup_module(base, name)
                        if ref is not None:
                            return ref
                    continue
                if (a.asname or a.name) != name:
                    continue
                sub = f"{base}.{a.name}"
                if self.tree.is_module(sub):
                    return Mod(sub)
                if self.tree.is_module(base):
                    return self.lookup_module(base, a.name)
                return None if _in_package(base) else External(sub)
            return None
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname == name:
                    return self._module_ref(a.name)
                if a.asname is None and a.name.split(".")[0] == name:
                    return self._module_ref(name)
        return None

    # -- expressions and classes
    def resolve_expr(self, module: str, expr: ast.AST, cls: Optional[Cls] = None) -> Optional[Ref]:
        """A Name or Attribute chain evaluated in `module` (first in `cls`'s body for a bare name)."""
        if isinstance(expr, ast.Subscript):  # Generic[T], Base[...]
            return self.resolve_expr(module, expr.value, cls)
        if isinstance(expr, ast.Name):
            if cls is not None:
                for node in reversed(_bindings(cls.node.body, expr.id)):
                    key = ("e", id(node), expr.id)
                    if key in self._active:
                        continue
                    self._active.add(key)
                    try:
                        ref = self._from_binding(module, node, expr.id, cls)
                    finally:
                        self._active.discard(key)
                    if ref is not None:
                        return ref
            ref = self.lookup_module(module, expr.id)
            return ref if ref is not None else External(expr.id)
        if isinstance(expr, ast.Attribute):
            base = self.resolve_expr(module, expr.value, cls)
            return None if base is None else self.member(base, expr.attr)
        return None

    def member(self, ref: Ref, name: str) -> Optional[Ref]:
        if isinstance(ref, Mod):
            return self.lookup_module(ref.name, name)
        if isinstance(ref, Cls):
            return self.lookup_class(ref, name)
        if isinstance(ref, External):
            return External(f"{ref.name}.{name}")
        return None

    def bases(self, cls: Cls) -> list[Ref]:
        return [b for b in (self.resolve_expr(cls.module, e) for e in cls.node.bases) if b is not None]

    def mro(self, cls: Cls) -> list[Cls]:
        """The class and its bases in the tree, depth first, left to right (each once)."""
        out: list[Cls] = []
        seen: set[int] = set()

        def visit(c: Cls) -> None:
            if id(c.node) in seen:
                return
            seen.add(id(c.node))
            out.append(c)
            for b in self.bases(c):
                if isinstance(b, Cls):
                    visit(b)

        visit(cls)
        return out

    def lookup_class(self, cls: Cls, name: str) -> Optional[Ref]:
        """`name` defined in the class body or inherited from a base class in the tree, or None."""
        for c in self.mro(cls):
            for node in reversed(_bindings(c.node.body, name)):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    continue
                key = ("c", id(node), name)
                if key in self._active:
                    continue
                self._active.add(key)
                try:
                    ref = self._from_binding(c.module, node, name, c)
                finally:
                    self._active.discard(key)
                if ref is not None:
                    return ref
        return None

    def external_bases(self, cls: Cls) -> list[str]:
        return [b.name for c in self.mro(cls) for b in self.bases(c) if isinstance(b, External)]

    def instance_attr(self, cls: Cls) -> Callable[[str], Optional[str]]:
        """A function telling where an attribute is set on instances of `cls` ("Class.method:line"), or None."""
        def find(attr: str) -> Optional[str]:
            for c in self.mro(cls):
                for node in reversed(_bindings(c.node.body, attr)):
                    if not isinstance(node, (ast.Import, ast.ImportFrom)):
                        return f"declared in class {c.qualname.rsplit('.', 1)[-1]} (line {node.lineno})"
                for meth in c.node.body:
                    if not isinstance(meth, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        continue
                    for n in ast.walk(meth):
                        if (isinstance(n, ast.Attribute) and n.attr == attr and isinstance(n.ctx, ast.Store)
                                and isinstance(n.value, ast.Name) and n.value.id == "self"):
                            return f"set in {c.qualname.rsplit('.', 1)[-1]}.{meth.name} (line {n.lineno})"
                        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "setattr"
                                and len(n.args) >= 2 and isinstance(n.args[0], ast.Name) and n.args[0].id == "self"
                                and isinstance(n.args[1], ast.Constant) and n.args[1].value == attr):
                            return f"set in {c.qualname.rsplit('.', 1)[-1]}.{meth.name} (line {n.lineno})"
            return None
        return find

    def resolve(self, path: str) -> Optional[Ref]:
        """`path` (module.Class.method, module.function, module.CONST, ...) in the tree, or None when missing."""
        parts = path.split(".")
        for i in range(len(parts), 0, -1):
            mod = ".".join(parts[:i])
            if self.tree.is_module(mod):
                ref: Optional[Ref] = Mod(mod)
                for p in parts[i:]:
                    ref = self.member(ref, p)
                    if ref is None or isinstance(ref, External):
                        return None if ref is None else ref
                return ref
        return None


def _decorator_names(node: ast.AST) -> list[str]:
    out = []
    for d in getattr(node, "decorator_list", []):
        d = d.func if isinstance(d, ast.Call) else d
        out.append(d.attr if isinstance(d, ast.Attribute) else d.id if isinstance(d, ast.Name) else "")
    return out


def _params_of_def(node: ast.AST) -> list[Param]:
    a = node.args
    positional = [(p, "posonly") for p in a.posonlyargs] + [(p, "pos") for p in a.args]
    first_default = len(positional) - len(a.defaults)
    out = [Param(p.arg, kind, i >= first_default) for i, (p, kind) in enumerate(positional)]
    if a.vararg:
        out.append(Param(a.vararg.arg, "vararg"))
    out += [Param(p.arg, "kwonly", d is not None) for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg:
        out.append(Param(a.kwarg.arg, "varkw"))
    return out


def _dataclass_kw_only(node: ast.ClassDef) -> Optional[bool]:
    """True/False when decorated as a dataclass (kw_only or not); None when not a dataclass."""
    for d in node.decorator_list:
        call = d if isinstance(d, ast.Call) else None
        f = d.func if call else d
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        if name == "dataclass":
            for kw in (call.keywords if call else []):
                if kw.arg == "kw_only" and isinstance(kw.value, ast.Constant):
                    return bool(kw.value.value)
            return False
    return None


def _fields(node: ast.ClassDef, kw_only: bool) -> list[Param]:
    out = []
    for s in node.body:
        if not (isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)):
            continue
        ann = ast.unparse(s.annotation)
        if "ClassVar" in ann:
            continue
        if "KW_ONLY" in ann:
            kw_only = True
            continue
        default = s.value is not None
        if isinstance(s.value, ast.Call) and ast.unparse(s.value.func).split(".")[-1] == "field":
            default = any(k.arg in ("default", "default_factory") for k in s.value.keywords)
            if any(k.arg == "init" and isinstance(k.value, ast.Constant) and k.value.value is False
                   for k in s.value.keywords):
                continue
        out.append(Param(s.target.id, "kwonly" if kw_only else "pos", default))
    return out


@dataclasses.dataclass
class Found:
    """What a path resolved to: its kind, where it is defined and its parameters (None: not a callable we read)."""

    kind: str
    qualname: str
    where: str
    params: Optional[tuple[Param, ...]] = None
    note: str = ""


def describe(res: Resolver, path: str, instance_attr: bool = False) -> Optional[Found]:
    """Resolve `path` in `res`'s tree and describe it, or None when it is missing there."""
    if instance_attr:
        owner_path, attr = path.rsplit(".", 1)
        owner = res.resolve(owner_path)
        if not isinstance(owner, Cls):
            return None
        where = res.instance_attr(owner)(attr)
        if where is None:
            where = _assembled_field(res, owner, attr)
        return None if where is None else Found("instance attribute", f"{owner.qualname}.{attr}",
                                                f"{owner.module}", None, where)
    ref = res.resolve(path)
    if ref is None:
        return None
    if isinstance(ref, External):
        return Found("imported from outside SGLang", ref.name, ref.name)
    if isinstance(ref, Mod):
        return Found("module", ref.name, ref.name)
    if isinstance(ref, Value):
        return Found("attribute", ref.qualname, f"{ref.module}:{ref.node.lineno}")
    if isinstance(ref, Func):
        decos = _decorator_names(ref.node)
        where = f"{ref.module}:{ref.node.lineno}"
        if ref.owner is not None and ({"property", "cached_property"} & set(decos) or "setter" in decos):
            return Found("property", ref.qualname, where)
        params = _params_of_def(ref.node)
        kind = "function"
        if ref.owner is not None:
            kind = "method"
            if "classmethod" in decos:
                params, kind = params[1:], "classmethod"
            elif "staticmethod" in decos:
                kind = "staticmethod"
        return Found(kind, ref.qualname, where, tuple(params))
    # a class: called, it takes __init__'s parameters less self (or a dataclass's / msgspec Struct's fields)
    where = f"{ref.module}:{ref.node.lineno}"
    for c in res.mro(ref):
        init = next((s for s in reversed(_bindings(c.node.body, "__init__"))
                     if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
        if init is not None:
            return Found("class", ref.qualname, where, tuple(_params_of_def(init)[1:]),
                         "" if c is ref else f"__init__ of {c.qualname}")
        if _dataclass_kw_only(c.node) is not None or _is_struct(res, c):
            fields: list[Param] = []
            for b in reversed(res.mro(c)):
                kw = _dataclass_kw_only(b.node)
                if kw is None and _is_struct(res, b):
                    kw = any(k.arg == "kw_only" and isinstance(k.value, ast.Constant) and k.value.value
                             for k in b.node.keywords)
                if kw is not None:
                    names = {p.name for p in _fields(b.node, kw)}
                    fields = [p for p in fields if p.name not in names] + _fields(b.node, kw)
            return Found("class", ref.qualname, where, tuple(fields), "fields")
    return Found("class", ref.qualname, where, None, "its __init__ is not in SGLang")


def _assembled_field(res: Resolver, owner: Cls, attr: str) -> Optional[str]:
    """Where `attr` comes from when `owner`'s annotations are assembled at import time from other classes.

    The pattern (SGLang 0.5.23's `ServerArgs`): the module assigns `Owner.__annotations__` from field classes it
    imports. A field class counts when it declares `attr` and the owner's module imports it by name.
    """
    tree = res.tree.parse(owner.module)
    line = None
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else []
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update":
            targets = [node.func.value]
        for t in targets:
            if (isinstance(t, ast.Attribute) and t.attr == "__annotations__" and isinstance(t.value, ast.Name)
                    and t.value.id == owner.node.name):
                line = node.lineno
    if line is None:
        return None
    for qual, fline in res.tree.fields_named(attr):
        mod, name = qual.rsplit(".", 1)
        ref = res.lookup_module(owner.module, name)
        if isinstance(ref, Cls) and ref.qualname == qual:
            return (f"field declared on `{qual}` (line {fline}), which `{owner.module}` imports and merges into "
                    f"`{owner.node.name}.__annotations__` at import time (line {line})")
    return None


def _is_struct(res: Resolver, cls: Cls) -> bool:
    return any(b.name.endswith("Struct") for b in res.bases(cls) if isinstance(b, External))


def format_params(params: Optional[Iterable[Param]]) -> str:
    """`(a, b=…, *args, c, **kw)`: names, kinds and whether there is a default (not its value)."""
    if params is None:
        return "?"
    params = list(params)
    out: list[str] = []
    for i, p in enumerate(params):
        if p.kind == "kwonly" and not any(q.kind in ("vararg", "kwonly") for q in params[:i]):
            out.append("*")
        out.append({"vararg": "*", "varkw": "**"}.get(p.kind, "") + p.name + ("=…" if p.default else ""))
        if p.kind == "posonly" and (i + 1 == len(params) or params[i + 1].kind != "posonly"):
            out.append("/")
    return "(" + ", ".join(out) + ")"


def diff_params(old: tuple[Param, ...], new: tuple[Param, ...]) -> str:
    """A short account of what changed between two parameter lists."""
    o, n = {p.name: p for p in old}, {p.name: p for p in new}
    notes = []
    added = [p.name for p in new if p.name not in o]
    removed = [p.name for p in old if p.name not in n]
    if added:
        notes.append("added " + ", ".join(added))
    if removed:
        notes.append("removed " + ", ".join(removed))
    for p in new:
        q = o.get(p.name)
        if q is None:
            continue
        if q.kind != p.kind:
            notes.append(f"{p.name}: {q.kind} -> {p.kind}")
        if q.default != p.default:
            notes.append(f"{p.name}: default {'added' if p.default else 'removed'}")
    common_old = [p.name for p in old if p.name in n]
    common_new = [p.name for p in new if p.name in o]
    if common_old != common_new:
        notes.append("reordered")
    return "; ".join(notes) or "changed"


# ------------------------------------------------------------------------------------------------------ comparing
@dataclasses.dataclass
class Row:
    """One symbol compared: status is "same", "changed" or "missing" (or "not found in pinned" for a resolver gap)."""

    path: str
    used_by: str
    status: str
    detail: str
    relied: tuple[str, ...] = ()
    relied_ok: Optional[bool] = None


def candidates(tree: SourceTree, path: str, instance_attr: bool = False, limit: int = 8) -> list[str]:
    """Same-named definitions elsewhere in `tree`: where a missing symbol may have moved."""
    parts = path.split(".")
    leaf, owner = parts[-1], (parts[-2] if len(parts) > 1 else "")
    res = Resolver(tree)
    found: list[str] = []
    if owner[:1].isupper():  # Class.member: the class elsewhere, with the member
        for qual, kind, line in tree.defs_named(owner):
            if kind != "class":
                continue
            d = describe(res, f"{qual}.{leaf}", instance_attr)
            if d is not None:
                found.append(f"{qual}.{leaf}")
        if found or instance_attr or leaf.startswith("__"):
            return _cap(found, limit)
    for qual, kind, line in tree.defs_named(leaf):
        found.append(qual)
    # nearest first: the same top-level package path as the old one
    prefix = ".".join(parts[:3])
    found.sort(key=lambda q: (not q.startswith(prefix), q))
    return _cap(found, limit)


def _missing_reason(res: Resolver, path: str) -> str:
    """Why `path` is missing: the longest prefix that still resolves and the part it lacks ("module `x` has no `y`")."""
    parts = path.split(".")
    for i in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:i])
        ref = Mod(prefix) if res.tree.is_module(prefix) else res.resolve(prefix)
        if ref is not None:
            what = "module" if isinstance(ref, Mod) else "class" if isinstance(ref, Cls) else "it"
            return f"{what} `{prefix.replace('sglang.srt.', '')}` has no `{parts[i]}`"
    return "not found"


def _cap(items: list[str], limit: int) -> list[str]:
    return items if len(items) <= limit else items[:limit] + [f"… {len(items) - limit} more"]


def compare(old: Resolver, new: Resolver, path: str, used_by: str = "", relied: tuple[str, ...] = (),
            instance_attr: bool = False, with_candidates: bool = True, hooked: bool = False) -> Row:
    """Compare one symbol between the pinned tree (`old`) and the newer one (`new`)."""
    a = describe(old, path, instance_attr)
    b = describe(new, path, instance_attr)
    row = Row(path, used_by, "", "", relied)
    if b is None:
        row.status = "missing"
        cands = candidates(new.tree, path, instance_attr) if with_candidates else []
        owner = path.rsplit(".", 1)[0]
        if instance_attr and isinstance(new.resolve(owner), Cls):
            row.detail = f"no longer set on instances of `{owner.rsplit('.', 1)[-1]}`"
        else:
            row.detail = _missing_reason(new, path)
        row.detail += ("; same-named elsewhere: " + ", ".join(f"`{c}`" for c in cands)) if cands else (
            "" if instance_attr else "; no same-named definition elsewhere in the package")
        if a is None:
            row.detail += " (not found statically in the pinned version either)"
        return row
    if a is None:
        row.status = "not found in pinned"
        row.detail = f"found in the new version ({b.kind} at `{b.where}`) but not statically in the pinned one"
        return row
    notes = []
    if a.kind != b.kind:
        notes.append(f"kind {a.kind} -> {b.kind}")
    if a.qualname != b.qualname and not instance_attr:
        notes.append(f"now defined as `{b.qualname}` (was `{a.qualname}`)")
    if (hooked and a.qualname != b.qualname and b.kind == "function"
            and b.qualname.rsplit(".", 1)[0] != path.rsplit(".", 1)[0]):
        notes.append(f"re-exported from `{b.qualname.rsplit('.', 1)[0]}`: a hook on this name does not reach "
                     "callers that import it from there")
    if a.params != b.params and a.params is not None and b.params is not None:
        row.status = "changed"
        notes.insert(0, f"`{format_params(a.params)}` -> `{format_params(b.params)}` "
                        f"({diff_params(a.params, b.params)})")
    elif a.params != b.params:
        row.status = "changed"
        notes.insert(0, f"`{format_params(a.params)}` -> `{format_params(b.params)}`")
    else:
        row.status = "changed" if a.kind != b.kind else "same"
        if b.params is not None:
            notes.insert(0, f"`{format_params(b.params)}`")
        elif instance_attr:
            notes.insert(0, b.note)
        else:
            notes.insert(0, b.kind)
    if relied:
        got = [p.name for p in (b.params or ())]
        row.relied_ok = got[: len(relied)] == list(relied)
        if not row.relied_ok and row.status != "missing":
            notes.append(f"**the leading parameters the overlay relies on, {list(relied)}, no longer match**")
        elif row.status == "changed":
            notes.append(f"the leading parameters the overlay relies on ({', '.join(relied)}) still match")
    row.detail = "; ".join(n for n in notes if n)
    return row


# ---------------------------------------------------------------------------------------------------- the table
def hook_table() -> dict[str, list[tuple[str, str, tuple[str, ...], bool]]]:
    """The overlay's hook table, enumerated as `tests/test_hooks.py` does: section -> (path, used by, params, attr)."""
    from sgl_sidp.hooks import HOOKS, TORCH_HOOKS, USED_SYMBOLS

    hooks: dict[str, tuple[list[str], tuple[str, ...]]] = {}
    for h in HOOKS:
        users, params = hooks.setdefault(h.target, ([], ()))
        users.append(f"{h.runtime.rsplit(':', 1)[-1]}.{h.method} ({h.hook_type})")
        hooks[h.target] = (users, h.params if len(h.params) > len(params) else params)
    torch_attrs: dict[str, list[str]] = {}
    for name, th in TORCH_HOOKS.items():
        for attr in th.sglang_attrs:
            torch_attrs.setdefault(attr, []).append(name)
    used: dict[tuple[str, bool], tuple[str, ...]] = {}
    for s in USED_SYMBOLS:
        used.setdefault((s.path, s.instance_attr), s.params)
    return {
        "hooks": [(t, ", ".join(u), p, False) for t, (u, p) in hooks.items()],
        "torch": [(a, ", ".join(n), (), True) for a, n in torch_attrs.items()],
        "used": [(p, "", params, attr) for (p, attr), params in used.items()],
    }


#: Accessors the overlay could move to, checked in both trees: label -> alternative paths (any one is enough).
ACCESSORS: tuple[tuple[str, tuple[tuple[str, bool], ...], str], ...] = (
    ("parallel_state.get_tp_group()", (("sglang.srt.distributed.parallel_state.get_tp_group", False),),
     "The TP group coordinator (has `broadcast_object`), a module function"),
    ("parallel_state.get_world_group()", (("sglang.srt.distributed.parallel_state.get_world_group", False),), ""),
    ("parallel_state.get_tensor_model_parallel_rank()",
     (("sglang.srt.distributed.parallel_state.get_tensor_model_parallel_rank", False),), ""),
    ("parallel_state.get_tensor_model_parallel_world_size()",
     (("sglang.srt.distributed.parallel_state.get_tensor_model_parallel_world_size", False),), ""),
    ("runtime_context.get_parallel()", (("sglang.srt.runtime_context.get_parallel", False),),
     "The process's parallel context"),
    ("get_parallel().tp_group", (("sglang.srt.runtime_context.ParallelContext.tp_group", False),
                                 ("sglang.srt.arg_groups.fields.parallel.Parallel.tp_group", False)),
     "A `ParallelContext` property, or a declared field of `arg_groups.fields.parallel.Parallel` that "
     "`ParallelContext.__getattr__` reads"),
    ("get_parallel().tp_rank", (("sglang.srt.runtime_context.ParallelContext.tp_rank", False),
                                ("sglang.srt.arg_groups.fields.parallel.Parallel.tp_rank", False)), ""),
    ("get_parallel().tp_size", (("sglang.srt.runtime_context.ParallelContext.tp_size", False),
                                ("sglang.srt.arg_groups.fields.parallel.Parallel.tp_size", False)), ""),
    ("get_parallel().dp_rank", (("sglang.srt.runtime_context.ParallelContext.dp_rank", False),
                                ("sglang.srt.arg_groups.fields.parallel.Parallel.dp_rank", False)),
     "The DP replica's rank (the overlay reads `ps.dp_rank` in `sgl_sidp.process.dp_rank`, the one place left on "
     "0.5.17-only API: no DP-rank accessor exists in both versions)"),
    ("ModelRunner.ps", (("sglang.srt.model_executor.model_runner.ModelRunner.ps", True),),
     "Only its `dp_rank` is still read (`sgl_sidp.process.dp_rank`); TP rank, size and group come from "
     "`parallel_state`'s functions"),
    ("ModelRunner.tp_group", (("sglang.srt.model_executor.model_runner.ModelRunner.tp_group", True),), ""),
    ("ModelRunner.mem_fraction_static", (("sglang.srt.model_executor.model_runner.ModelRunner.mem_fraction_static",
                                          True),), ""),
    ("ModelRunner.server_args", (("sglang.srt.model_executor.model_runner.ModelRunner.server_args", True),), ""),
    ("ServerArgs.mem_fraction_static", (("sglang.srt.server_args.ServerArgs.mem_fraction_static", True),), ""),
    ("ModelRunner.gpu_id", (("sglang.srt.model_executor.model_runner.ModelRunner.gpu_id", True),), ""),
    ("breakable_cuda_graph.eager_on_graph",
     (("sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.breakable_cuda_graph.eager_on_graph",
       False),),
     "The graph-break decorator factory the prefetch ring calls as `eager_on_graph(enable=True)`"),
)


def accessor_rows(old: Resolver, new: Resolver, versions: tuple[str, str] = ("pinned", "new")
                  ) -> list[tuple[str, str, str, str]]:
    """(label, in pinned, in new, note) for each of `ACCESSORS`; the note says what both offer."""
    out = []
    for label, alts, note in ACCESSORS:
        cells = []
        for res in (old, new):
            hit = None
            for path, attr in alts:
                d = describe(res, path, attr)
                if d is not None:
                    hit = (path, d)
                    break
            if hit is None:
                cells.append(("no", None))
                continue
            path, d = hit
            how = d.note if attr else (f"{d.kind} `{format_params(d.params)}`" if d.params is not None else d.kind)
            cells.append((f"yes: `{path.replace('sglang.srt.', '')}` ({how})", d))
        both = cells[0][1] is not None and cells[1][1] is not None
        notes = [note] if note else []
        if label.endswith("eager_on_graph") and both:
            ok = [_accepts_keyword(d.params, "enable") for _, d in cells]
            pos = [_first_positional(d.params) for _, d in cells]
            bool_first = [_takes_bool_first(res, alts[0][0]) for res in (old, new)]
            notes.append(f"`eager_on_graph(enable=True)` accepted: pinned {_yes(ok[0])}, new {_yes(ok[1])}")
            notes.append(f"First positional parameter: pinned `{pos[0]}`, new `{pos[1]}`; a bool passed first "
                         f"(`eager_on_graph(True)`) still means enable: pinned {bool_first[0]}, new {bool_first[1]}")
        where = ("**in both**" if both else f"only in {versions[0]}" if cells[0][1] is not None
                 else f"only in {versions[1]}" if cells[1][1] is not None else "in neither")
        out.append((label, cells[0][0], cells[1][0], ". ".join([where, *notes])))
    return out


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _takes_bool_first(res: Resolver, path: str) -> str:
    """Whether a bool passed first means `enable`: "yes (...)" when the first parameter is `enable` or the body
    tests `isinstance(<first parameter>, bool)` (0.5.23's support for `eager_on_graph(True)`), else "no"."""
    ref = res.resolve(path)
    if not isinstance(ref, Func):
        return "no"
    first = _first_positional(tuple(_params_of_def(ref.node)))
    if first == "enable":
        return "yes (its first parameter)"
    if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "isinstance"
           and len(n.args) == 2 and isinstance(n.args[0], ast.Name) and n.args[0].id == first
           and isinstance(n.args[1], ast.Name) and n.args[1].id == "bool" for n in ast.walk(ref.node)):
        return f"yes (the body tests `isinstance({first}, bool)`)"
    return "no"


def _accepts_keyword(params: Optional[tuple[Param, ...]], name: str) -> bool:
    return any(p.name == name and p.kind in ("pos", "kwonly") for p in params or ()) or any(
        p.kind == "varkw" for p in params or ())


def _first_positional(params: Optional[tuple[Param, ...]]) -> str:
    return next((p.name for p in params or () if p.kind in ("posonly", "pos")), "-")


# ------------------------------------------------------------------------------------------------------ the wheel
def _pypi_project() -> dict:
    """PyPI's JSON description of the sglang project (every release and its files)."""
    with urllib.request.urlopen(PYPI_JSON, timeout=60) as r:
        return json.load(r)


def newest_version() -> str:
    """The newest SGLang release on PyPI (its JSON API's `info.version`)."""
    try:
        return _pypi_project()["info"]["version"]
    except Exception as e:  # noqa: BLE001 - any failure to ask PyPI is a failure to get the wheel
        raise CheckError(f"cannot ask PyPI for the newest {PACKAGE} release: {e}") from e


def pypi_sha256(version: str, filename: str) -> Optional[str]:
    """PyPI's published sha256 of one file of `version`, or None when it cannot be had."""
    try:
        files = _pypi_project()["releases"].get(version, [])
    except Exception:  # noqa: BLE001 - only a cross-check
        return None
    return next((f["digests"]["sha256"] for f in files if f["filename"] == filename), None)


def download(version: str, dest: Path) -> Path:
    """`pip download sglang==version --no-deps` (a wheel only) into `dest`; the wheel's path."""
    cmd = [sys.executable, "-m", "pip", "download", f"{PACKAGE}=={version}", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", "-d", str(dest)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob(f"{PACKAGE}-{version}-*.whl"))
    if p.returncode != 0 or not wheels:
        last = (p.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
        raise CheckError(f"pip download {PACKAGE}=={version} failed: {last}")
    return wheels[0]


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def wheel_version(path: Path) -> str:
    m = re.match(rf"{PACKAGE}-([^-]+)-", path.name)
    return m.group(1) if m else "?"


# ------------------------------------------------------------------------------------------------------ the report
def _cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def report(old: Resolver, new: Resolver, old_version: str, old_dir: str, new_version: str, wheel_name: str,
           wheel_sha: str, command: str, table: Optional[dict] = None, sha_note: str = "",
           today: Optional[str] = None) -> tuple[str, dict[str, list[Row]]]:
    """The markdown report and its rows per section."""
    table = hook_table() if table is None else table
    titles = {
        "hooks": ("Hooks (`sgl_sidp.hooks.HOOKS`)", "the targets patched through SGLang's `HookRegistry`"),
        "torch": ("SGLang attributes the torch hooks use (`TORCH_HOOKS`)", "instance attributes"),
        "used": ("Other SGLang symbols the overlay calls or reads (`USED_SYMBOLS`)",
                 "callables (parameters compared) and instance attributes (present or not)"),
    }
    rows = {sec: [compare(old, new, p, u, r, a, hooked=sec == "hooks") for p, u, r, a in entries]
            for sec, entries in table.items()}
    today = today or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    out = [
        f"# SGLang {new_version} against the pinned {old_version}: the hook table, read statically",
        "",
        f"Command (from the repository root): `{command}`  ",
        f"Date: {today} (UTC)",
        "",
        f"- Checked: SGLang **{new_version}**, wheel `{wheel_name}`, sha256 `{wheel_sha}`{sha_note}",
        f"- Against: SGLang {old_version} as installed (`{old_dir}`), read the same way",
        "- How: both trees' sources parsed with `ast`, nothing installed or imported; each symbol resolved "
        "module -> class -> member, following imports, re-exports, simple assignments and base classes; parameters "
        "compared by name, order, kind and whether each has a default (`=…`: has one; values not compared). A "
        "class's parameters are its `__init__`'s less `self` (a dataclass's: its fields). Instance attributes: "
        "present when a method assigns `self.<name>` or the class declares it.",
        "",
        "## Summary",
        "",
        "| table | symbols | same | parameters changed | missing |",
        "|---|---:|---:|---:|---:|",
    ]
    for sec, rs in rows.items():
        n = {s: sum(r.status == s for r in rs) for s in ("same", "changed", "missing")}
        other = len(rs) - sum(n.values())
        out.append(f"| {titles[sec][0]} | {len(rs)} | {n['same']} | {n['changed']} | {n['missing']}"
                   + (f" (+{other} not found statically in the pinned version)" if other else "") + " |")
    out.append("")
    broken = [r for rs in rows.values() for r in rs if r.status != "missing" and r.relied_ok is False]
    out += [
        "Changed or missing, in one list:",
        "",
        *[f"- `{r.path}`: {r.status}" for rs in rows.values() for r in rs if r.status != "same"],
        "",
        "Leading parameters the overlay relies on that no longer match: "
        + (", ".join(f"`{r.path}`" for r in broken) if broken else "none") + ".",
        "",
    ]
    for sec, rs in rows.items():
        title, what = titles[sec]
        out += [f"## {title}", "", f"{len(rs)} symbols: {what}.", ""]
        if sec == "hooks":
            out += ["| symbol | hooked by | status | details |", "|---|---|---|---|"]
        elif sec == "torch":
            out += ["| symbol | torch hook | status | details |", "|---|---|---|---|"]
        else:
            out += ["| symbol | status | details |", "|---|---|---|"]
        for r in rs:
            sym = f"`{r.path.replace('sglang.srt.', '')}`"
            status = {"changed": "**parameters changed**" if "->" in r.detail.split(";")[0] else "**changed**",
                      "missing": "**missing**"}.get(r.status, r.status)
            cells = [sym] + ([_cell(r.used_by)] if sec != "used" else []) + [status, _cell(r.detail)]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    out += [
        "## Accessors in both versions",
        "",
        "Where the overlay's reads could move so that one code base runs on both versions (paths under "
        "`sglang.srt.`; checked statically the same way).",
        "",
        f"| accessor | in {old_version} | in {new_version} | note |",
        "|---|---|---|---|",
    ]
    for label, a, b, note in accessor_rows(old, new, (old_version, new_version)):
        out.append(f"| `{label}` | {_cell(a)} | {_cell(b)} | {_cell(note)} |")
    out.append("")
    return "\n".join(out), rows


def _here(path: str) -> str:
    """`path` relative to the working directory when it lies under it (the report's command and paths)."""
    rel = os.path.relpath(os.path.abspath(path))
    return rel if not rel.startswith("..") else path


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        description="Check a newer SGLang release against the overlay's hook table without installing it: read the "
        "release's wheel as a zip, parse its Python sources, and list every hooked or used SGLang symbol that is "
        "missing there or whose parameters changed, compared with the installed (pinned) SGLang. Prints a markdown "
        "report. Exit code 0 when the check ran (whatever it found); 2 when the wheel could not be got or read. "
        "Needs PyPI (pip download, no dependencies) unless --wheel is given.",
    )
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--version", metavar="X.Y.Z", help="the SGLang release to check (default: the newest one on PyPI)")
    src.add_argument("--wheel", type=Path, metavar="PATH", help="check this wheel file instead of downloading one")
    ap.add_argument("--download-dir", type=Path, metavar="DIR",
                    help="keep the downloaded wheel here (default: a temporary directory, removed afterwards)")
    ap.add_argument("--pinned-dir", metavar="DIR", help="the directory holding the pinned sglang/ package "
                    "(default: the installed one, found from its package metadata)")
    ap.add_argument("--out", type=Path, metavar="FILE", help="write the report to this file (default: print it)")
    a = ap.parse_args(argv)
    command = shlex.join([_here(sys.executable) if argv is None else "python",
                          _here(sys.argv[0]) if argv is None else "scripts/check_next_sglang.py",
                          *(sys.argv[1:] if argv is None else argv)])
    try:
        old_tree, old_version, old_dir = installed_tree(a.pinned_dir)
        with tempfile.TemporaryDirectory() as tmp:
            sha_note, published = "", None
            if a.wheel is not None:
                wheel = a.wheel
                if not wheel.is_file():
                    raise CheckError(f"no such wheel: {wheel}")
            else:
                version = a.version or newest_version()
                dest = a.download_dir or Path(tmp)
                dest.mkdir(parents=True, exist_ok=True)
                wheel = download(version, dest)
                published = pypi_sha256(version, wheel.name)
                if published is not None:
                    sha_note = " (matches PyPI's published sha256)"
            digest = sha256(wheel)
            if published is not None and published != digest:
                raise CheckError(f"{wheel.name}: sha256 {digest} differs from PyPI's")
            try:
                zf = zipfile.ZipFile(wheel)
            except (zipfile.BadZipFile, OSError) as e:
                raise CheckError(f"{wheel}: not a readable wheel: {e}") from e
            with zf:
                new_version = wheel_version(wheel)
                new_tree = SourceTree.from_zip(zf, new_version)
                text, _ = report(Resolver(old_tree), Resolver(new_tree), old_version, _here(old_dir), new_version,
                                 wheel.name, digest, command, sha_note=sha_note)
    except CheckError as e:
        print(f"check_next_sglang: {e}", file=sys.stderr)
        return 2
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text)
        print(f"wrote {a.out}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
