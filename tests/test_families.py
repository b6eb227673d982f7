"""The family matrix on CPU: each feature's architecture allowlist holds against the pinned SGLang's model classes, and
every family of `scripts/make_family_models.py` is accepted or refused at launch by exactly that allowlist.

Which (family, mode) pairs are accepted here is what `tests/gpu/test_family_matrix.py` proves exact on a GPU.
"""

import inspect
import pkgutil
import runpy
from pathlib import Path
from types import SimpleNamespace

import pytest

from sgl_sidp.config import SidpConfig, SidpConfigError
from sgl_sidp.features import FEATURES
from sgl_sidp.hooks import FUSED_MOE, HOOKS, USED_SYMBOLS
from sgl_sidp.model_info import model_is_moe

FAMILIES = runpy.run_path(str(Path(__file__).resolve().parents[1] / "scripts/make_family_models.py"))


def sglang_model_class(arch):
    from sglang.srt.models.registry import ModelRegistry

    return ModelRegistry.models[arch]


def covered(feature, cls_path):
    """The class is one the feature's hooks act on: the owner of one of its hook targets, of a symbol its bodies
    read (`USED_SYMBOLS`), or FusedMoE (ZeroDP)."""
    owners = {h.target.rsplit(".", 1)[0] for h in HOOKS if h.feature == feature}
    owners |= {s.path.rsplit(".", 1)[0] for s in USED_SYMBOLS}
    return cls_path in owners or cls_path == FUSED_MOE


ALLOWED = [(name, arch, cls) for name, f in FEATURES.items() for arch, classes in f.architectures.items() for cls in classes]


@pytest.mark.parametrize("feature, arch, cls_path", ALLOWED, ids=lambda x: str(x).rsplit(".", 1)[-1])
def test_allowlist_entries_are_derived_from_the_hooked_classes(feature, arch, cls_path):
    """Each allowed architecture's SGLang model class builds its layers from a class the feature's hooks act on: the
    class is hooked (or read) by that feature, and a module in the model class's MRO uses it (FusedMoE: through
    SGLang's `get_moe_impl_class`)."""
    pkgutil.resolve_name(cls_path)
    assert covered(feature, cls_path), f"{cls_path} is no class the {feature} hooks act on"
    model_cls = sglang_model_class(arch)
    name = cls_path.rsplit(".", 1)[-1]
    uses = {name, "get_moe_impl_class"} if cls_path == FUSED_MOE else {name}
    sources = [inspect.getsource(inspect.getmodule(c)) for c in model_cls.__mro__ if c.__module__.startswith("sglang.")]
    assert any(u in src for u in uses for src in sources), f"SGLang's {model_cls.__name__} does not use {name}"


def expected(family, mode):
    """"accepted" where the family's architecture is in the mode's allowlist, else "refused"."""
    arch = FAMILIES["FAMILIES"][family][1]
    return "accepted" if arch in FEATURES[mode].architectures else "refused"


@pytest.fixture(scope="module")
def family_configs(tmp_path_factory):
    out = tmp_path_factory.mktemp("families")
    return {f: str(FAMILIES["make"](f, out, config_only=True)) for f in FAMILIES["FAMILIES"]}


MODE_ARGS = {"zerodp": ["--overlay-mode", "zerodp"], "sidp": ["--overlay-mode", "sidp"], "shift": ["--overlay-mode", "shift"]}


@pytest.mark.parametrize("mode", list(MODE_ARGS))
@pytest.mark.parametrize("family", list(FAMILIES["FAMILIES"]))
def test_every_family_is_accepted_or_refused_by_the_allowlist(family_configs, family, mode, monkeypatch):
    import argparse

    monkeypatch.setattr("sgl_sidp.peer.topology.visible_gpu_count", lambda: 8)
    p = argparse.ArgumentParser()
    SidpConfig.add_cli_args(p)
    cfg = SidpConfig.from_cli_args(p.parse_args(MODE_ARGS[mode]))
    dp = 1 if mode == "shift" else 2
    raw = SimpleNamespace(model_path=family_configs[family], dp_size=dp, tp_size=1, base_gpu_id=0, gpu_id_step=1)
    try:
        cfg.validate_against(raw)
        got = "accepted"
    except SidpConfigError as e:
        got = "refused"
        arch = FAMILIES["FAMILIES"][family][1]
        assert len(e.value.problems if hasattr(e, "value") else e.problems) == 1, e.problems
        line = e.problems[0]
        moe = model_is_moe(family_configs[family])
        kind_refusal = (mode == "zerodp") != bool(moe)  # a dense model for ZeroDP, an MoE one for SiDP/Shift
        assert ("is MoE" in line or "has no MoE layers" in line) if kind_refusal else (f"not {arch}" in line), line
    assert got == expected(family, mode)


def test_the_matrix_covers_what_the_issue_asks():
    """Dense with and without attention biases, MoE with and without shared experts, MLA, an unknown MLP class."""
    fam = FAMILIES["FAMILIES"]
    assert {"qwen2", "llama", "qwen2_moe", "mixtral", "deepseek_v2", "gemma"} <= set(fam)
    assert expected("gemma", "sidp") == expected("gemma", "shift") == "refused"
