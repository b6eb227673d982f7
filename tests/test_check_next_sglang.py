"""scripts/check_next_sglang.py: the static reader and comparer, on small synthetic wheels built in memory.

No network and no SGLang import: each "wheel" is a zip of a few `sglang/` modules. The one test that downloads the
newest SGLang from PyPI runs only with SIDP_CHECK_NEXT_SGLANG_NETWORK=1.
"""

import hashlib
import importlib.util
import io
import os
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts/check_next_sglang.py"


@pytest.fixture(scope="module")
def cns():
    spec = importlib.util.spec_from_file_location("check_next_sglang", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop(spec.name, None)


def wheel_bytes(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, textwrap.dedent(text))
        zf.writestr("sglang-9.9.9.dist-info/METADATA", "Name: sglang\nVersion: 9.9.9\n")
    return buf.getvalue()


def tree(cns, files: dict[str, str], label: str = "t"):
    return cns.SourceTree.from_zip(zipfile.ZipFile(io.BytesIO(wheel_bytes(files))), label)


BASE = {"sglang/__init__.py": "", "sglang/srt/__init__.py": ""}

OLD = {
    **BASE,
    "sglang/version.py": '__version__ = "0.5.17"\n',
    "sglang/srt/mod.py": """
        class Runner:
            def __init__(self, cfg, gpu_id):
                self.ps = cfg
                self.tp_group, self.other = None, None

            def load(self):
                pass

            def step(self, batch, mode=None):
                pass

        def helper(x, *, flag=False):
            pass

        def gone(a):
            pass
    """,
    "sglang/srt/pkg/__init__.py": "from .impl import exported\n",
    "sglang/srt/pkg/impl.py": "def exported(a, b=1):\n    pass\n",
}

NEW = {
    **BASE,
    "sglang/srt/mod.py": """
        class Base:
            def load(self):
                pass

        class Runner(Base):
            def __init__(self, cfg):
                self.gpu_id = 0

            def step(self, batch, mode=None, *, extra=None):
                pass

        def helper(x, *, flag=False):
            pass
    """,
    "sglang/srt/other.py": "def gone(a):\n    pass\n",
    "sglang/srt/pkg/__init__.py": "from sglang.srt.pkg.impl2 import *\n",
    "sglang/srt/pkg/impl2.py": "def exported(a, b=1):\n    pass\n",
}


@pytest.fixture(scope="module")
def pair(cns):
    return cns.Resolver(tree(cns, OLD, "old")), cns.Resolver(tree(cns, NEW, "new"))


def test_unchanged_symbol_is_same(cns, pair):
    row = cns.compare(*pair, "sglang.srt.mod.helper", relied=("x",))
    assert (row.status, row.detail, row.relied_ok) == ("same", "`(x, *, flag=…)`", True)


def test_changed_parameters_are_listed_old_to_new(cns, pair):
    row = cns.compare(*pair, "sglang.srt.mod.Runner.step", relied=("self", "batch"))
    assert row.status == "changed" and row.relied_ok
    assert "`(self, batch, mode=…)` -> `(self, batch, mode=…, *, extra=…)` (added extra)" in row.detail
    assert "(self, batch) still match" in row.detail
    init = cns.compare(*pair, "sglang.srt.mod.Runner.__init__", relied=("self", "cfg", "gpu_id"))
    assert init.status == "changed" and init.relied_ok is False
    assert "removed gpu_id" in init.detail and "no longer match" in init.detail


def test_missing_symbol_names_where_a_same_named_def_lives(cns, pair):
    row = cns.compare(*pair, "sglang.srt.mod.gone")
    assert row.status == "missing"
    assert row.detail == "module `mod` has no `gone`; same-named elsewhere: `sglang.srt.other.gone`"
    nowhere = cns.compare(*pair, "sglang.srt.nope.f")
    assert nowhere.status == "missing" and "module `sglang.srt` has no `nope`" in nowhere.detail


def test_reexport_and_inheritance_are_followed(cns, pair):
    row = cns.compare(*pair, "sglang.srt.pkg.exported", hooked=True)  # `from .impl import` -> star import of impl2
    assert row.status == "same" and row.detail.startswith("`(a, b=…)`")
    assert "now defined as `sglang.srt.pkg.impl2.exported` (was `sglang.srt.pkg.impl.exported`)" in row.detail
    assert "a hook on this name does not reach callers" in row.detail  # a hooked module function moved away
    load = cns.compare(*pair, "sglang.srt.mod.Runner.load")
    assert load.status == "same" and "now defined as `sglang.srt.mod.Base.load`" in load.detail


def test_instance_attributes(cns, pair):
    gone = cns.compare(*pair, "sglang.srt.mod.Runner.ps", instance_attr=True)
    assert (gone.status, gone.detail) == ("missing", "no longer set on instances of `Runner`")
    kept = cns.compare(*pair, "sglang.srt.mod.Runner.load", instance_attr=True)  # a method counts as an attribute
    assert kept.status == "same"
    old, _ = pair
    assert cns.describe(old, "sglang.srt.mod.Runner.tp_group", instance_attr=True).note.startswith(
        "set in Runner.__init__")  # tuple unpacking
    new_only = cns.compare(*pair, "sglang.srt.mod.Runner.gpu_id", instance_attr=True)
    assert new_only.status == "not found in pinned"


def test_signature_kinds(cns):
    t = tree(cns, {**BASE, "sglang/srt/k.py": """
        import dataclasses
        from dataclasses import dataclass, field
        from typing import TYPE_CHECKING, ClassVar
        import msgspec
        if TYPE_CHECKING:
            from sglang.srt.elsewhere import Thing
        try:
            from sglang.srt.k2 import fast
        except ImportError:
            fast = None

        class C:
            def __init__(self, a, /, b, *args, c, d=2, **kw):
                pass
            @classmethod
            def make(cls, x, y=0):
                pass
            @staticmethod
            def pad(raw_size, buckets):
                pass
            @property
            def size(self):
                return 1
            alias = make

        @dataclass(kw_only=True)
        class D:
            x: int
            k: ClassVar[int] = 0
            y: list = field(default_factory=list)
            z: int = field(init=False, default=0)

        @dataclasses.dataclass
        class E(D):
            w: int = 1

        class S(msgspec.Struct, kw_only=True):
            a: int
            b: int = 0

        class Mode:
            NULL = 0

        def build(cls):
            return cls

        class Wrapped:
            def run(self, q):
                pass

        Wrapped = build(Wrapped)
        renamed = fast
    """, "sglang/srt/k2.py": "def fast(t, *, s):\n    pass\n"})
    res = cns.Resolver(t)

    def sig(path):
        d = cns.describe(res, path)
        return d.kind, cns.format_params(d.params)

    assert sig("sglang.srt.k.C") == ("class", "(a, /, b, *args, c, d=…, **kw)")
    assert sig("sglang.srt.k.C.__init__") == ("method", "(self, a, /, b, *args, c, d=…, **kw)")
    assert sig("sglang.srt.k.C.make") == ("classmethod", "(x, y=…)")
    assert sig("sglang.srt.k.C.alias") == ("classmethod", "(x, y=…)")
    assert sig("sglang.srt.k.C.pad") == ("staticmethod", "(raw_size, buckets)")
    assert sig("sglang.srt.k.C.size") == ("property", "?")
    assert sig("sglang.srt.k.D") == ("class", "(*, x, y=…)")
    assert sig("sglang.srt.k.E") == ("class", "(*, x, y=…, w=…)")
    assert sig("sglang.srt.k.S") == ("class", "(*, a, b=…)")
    assert sig("sglang.srt.k.fast") == ("function", "(t, *, s)")  # the try branch, not the except fallback
    assert sig("sglang.srt.k.renamed") == ("function", "(t, *, s)")  # a module-level alias
    assert sig("sglang.srt.k.Wrapped.run") == ("method", "(self, q)")  # `X = build(X)` keeps X's members
    assert cns.describe(res, "sglang.srt.k.Mode.NULL").kind == "attribute"
    assert cns.describe(res, "sglang.srt.k.Mode.NONE") is None
    assert cns.describe(res, "sglang.srt.k.Thing") is None  # only for type checkers, and not in the tree


def test_diff_params_wording(cns):
    P = cns.Param
    old = (P("fn", "pos"), P("enable", "pos"))
    new = (P("capture_stub", "pos", True), P("enable", "kwonly", True), P("fn", "pos"))
    assert cns.diff_params(old, new) == "added capture_stub; enable: pos -> kwonly; enable: default added; reordered"


def test_report_counts_and_accessors(cns, pair):
    table = {
        "hooks": [("sglang.srt.mod.Runner.step", "X.on_step (AFTER)", ("self", "batch"), False),
                  ("sglang.srt.mod.helper", "X.around_helper (AROUND)", ("x",), False),
                  ("sglang.srt.mod.gone", "X.g (BEFORE)", ("a",), False)],
        "torch": [("sglang.srt.mod.Runner.ps", "ring", (), True)],
        "used": [],
    }
    text, rows = cns.report(*pair, "0.5.17", "/site/sglang", "9.9.9", "sglang-9.9.9-py3-none-any.whl", "ab" * 32,
                            "python scripts/check_next_sglang.py", table=table, today="2030-01-01")
    lines = text.splitlines()
    assert lines[0] == "# SGLang 9.9.9 against the pinned 0.5.17: the hook table, read statically"
    assert lines[2:4] == ["Command (from the repository root): `python scripts/check_next_sglang.py`  ",
                          "Date: 2030-01-01 (UTC)"]
    assert "| Hooks (`sgl_sidp.hooks.HOOKS`) | 3 | 1 | 1 | 1 |" in lines
    assert "| `mod.gone` | X.g (BEFORE) | **missing** | module `mod` has no `gone`; same-named elsewhere: " \
           "`sglang.srt.other.gone` |" in lines
    assert "- `sglang.srt.mod.Runner.step`: changed" in lines and "- `sglang.srt.mod.helper`: same" not in lines
    assert "| `ModelRunner.tp_group` | no | no | in neither |" in lines  # the accessor section, on trees that have none
    assert [r.status for r in rows["hooks"]] == ["changed", "same", "missing"]


def test_main_on_a_wheel_file(cns, tmp_path, capsys):
    site = tmp_path / "site"
    for rel, text in OLD.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(textwrap.dedent(text))
    wheel = tmp_path / "sglang-9.9.9-py3-none-any.whl"
    wheel.write_bytes(wheel_bytes(NEW))
    out = tmp_path / "r" / "README.md"
    assert cns.main(["--wheel", str(wheel), "--pinned-dir", str(site), "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("# SGLang 9.9.9 against the pinned 0.5.17")
    assert f"sha256 `{hashlib.sha256(wheel.read_bytes()).hexdigest()}`" in text
    assert "| `managers.scheduler.Scheduler.__init__` |" in text  # the real hook table, every entry missing here
    assert "## Accessors in both versions" in text


@pytest.mark.parametrize("case", ["no file", "not a zip", "no sglang", "does not parse"])
def test_main_fails_with_one_line(cns, tmp_path, capsys, case):
    site = tmp_path / "site"
    (site / "sglang").mkdir(parents=True)
    (site / "sglang/__init__.py").write_text("")
    wheel = tmp_path / "sglang-9.9.9-py3-none-any.whl"
    if case == "not a zip":
        wheel.write_text("nope")
    elif case == "no sglang":
        wheel.write_bytes(wheel_bytes({"other/__init__.py": ""}))
    elif case == "does not parse":
        wheel.write_bytes(wheel_bytes({**BASE, "sglang/srt/managers/scheduler.py": "class Scheduler(:\n"}))
    assert cns.main(["--wheel", str(wheel), "--pinned-dir", str(site)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("check_next_sglang: ") and err.count("\n") == 1


@pytest.mark.skipif(os.environ.get("SIDP_CHECK_NEXT_SGLANG_NETWORK") != "1",
                    reason="downloads the newest SGLang wheel from PyPI; set SIDP_CHECK_NEXT_SGLANG_NETWORK=1")
def test_newest_release_from_pypi(cns, tmp_path):
    out = tmp_path / "README.md"
    assert cns.main(["--out", str(out)]) == 0
    assert "(matches PyPI's published sha256)" in out.read_text()
