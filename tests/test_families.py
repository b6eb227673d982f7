"""The family matrix on CPU: each feature's architecture allowlist holds against the pinned SGLang's model classes, and
every family of `scripts/make_family_models.py` is accepted or refused at launch by exactly that allowlist.

Which (family, mode) pairs are accepted here is what `tests/gpu/test_family_matrix.py` proves exact on a GPU.
"""

import inspect
import json
import pkgutil
import runpy
from pathlib import Path
from types import SimpleNamespace

import pytest

from sgl_sidp.config import SidpConfig, SidpConfigError
from sgl_sidp.features import FEATURES
from sgl_sidp.hooks import FUSED_MOE, HOOKS, USED_SYMBOLS
from sgl_sidp.model_info import model_is_moe, moe_layer_ids

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


REFUSED = [(name, arch, cls) for name, f in FEATURES.items() for arch, (classes, _) in f.refused.items()
           for cls in classes]


@pytest.mark.parametrize("feature, arch, cls_path", REFUSED, ids=lambda x: str(x).rsplit(".", 1)[-1])
def test_refusal_reasons_name_sglang_classes_the_hooks_do_not_act_on(feature, arch, cls_path):
    """Each refusal with a reason (`Feature.refused`) names a class of the pinned SGLang that the architecture's model
    class uses and that no hook of the feature acts on; the architecture is not also allowed."""
    assert arch not in FEATURES[feature].architectures
    pkgutil.resolve_name(cls_path)
    assert not covered(feature, cls_path), f"{cls_path} is a class the {feature} hooks act on"
    model_cls = sglang_model_class(arch)
    name = cls_path.rsplit(".", 1)[-1]
    sources = [inspect.getsource(inspect.getmodule(c)) for c in model_cls.__mro__ if c.__module__.startswith("sglang.")]
    assert any(f"{name}(" in src for src in sources), f"SGLang's {model_cls.__name__} does not build a {name}"
    assert name in FEATURES[feature].refused[arch][1]


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
        reason = FEATURES[mode].refused.get(arch)
        if reason and not kind_refusal:  # a refusal with a reason names the SGLang classes no hook acts on
            assert all(c.rsplit(".", 1)[-1] in line for c in reason[0]), line
    assert got == expected(family, mode)


def test_the_matrix_covers_what_the_issue_asks():
    """Dense with and without attention biases, MoE with and without shared experts, MLA, DeepSeek-V3's routing, Gemma
    1-3 (MLP classes no hook knows, soft-capping, sliding windows)."""
    fam = FAMILIES["FAMILIES"]
    assert {"qwen2", "llama", "qwen2_moe", "mixtral", "deepseek_v2", "deepseek_v3", "gemma", "gemma2",
            "gemma3"} <= set(fam)
    for gemma in ("gemma", "gemma2", "gemma3"):
        assert expected(gemma, "sidp") == expected(gemma, "shift") == expected(gemma, "zerodp") == "refused"
    assert expected("deepseek_v3", "zerodp") == "accepted"


def test_family_seeds_stay_put():
    """A family's seed is its index in FAMILIES, whichever families are built with it: new families go last, so the
    checkpoints measured before are built again bit for bit."""
    assert list(FAMILIES["FAMILIES"])[:9] == ["qwen3", "qwen2", "llama", "mistral", "gemma", "qwen3_moe", "qwen2_moe",
                                              "mixtral", "deepseek_v2"]


def test_randomize_gives_the_deepseek_v3_router_bias_values():
    """Hugging Face keeps DeepSeek-V3's e_score_correction_bias as a buffer at 0; the family's checkpoint gets
    values."""
    import torch

    class Gate(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(8, 4))
            self.register_buffer("e_score_correction_bias", torch.zeros(8))

    moe = torch.nn.Module()
    moe.gate = Gate()
    FAMILIES["randomize"](moe, 0)
    bias = moe.gate.e_score_correction_bias
    assert bias.abs().min() > 0 and 0.01 < float(bias.std()) < 0.2


#: DeepSeek-V3's and Kimi-K2's config.json (deepseek-ai/DeepSeek-V3, moonshotai/Kimi-K2-Instruct), abridged to the keys
#: the launch checks and SGLang's layer rules read; both are served by SGLang's DeepseekV3ForCausalLM.
DEEPSEEK_V3 = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "num_hidden_layers": 61,
               "first_k_dense_replace": 3, "moe_layer_freq": 1, "n_routed_experts": 256, "n_shared_experts": 1,
               "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4, "topk_method": "noaux_tc",
               "scoring_func": "sigmoid", "routed_scaling_factor": 2.5, "norm_topk_prob": True,
               "num_nextn_predict_layers": 1, "hidden_size": 7168, "moe_intermediate_size": 2048,
               "num_attention_heads": 128, "num_key_value_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
               "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
               "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                       "weight_block_size": [128, 128]}}
KIMI_K2 = {**DEEPSEEK_V3, "model_type": "kimi_k2", "first_k_dense_replace": 1, "n_routed_experts": 384, "n_group": 1,
           "topk_group": 1, "routed_scaling_factor": 2.827, "num_nextn_predict_layers": 0, "num_attention_heads": 64,
           "num_key_value_heads": 64}


@pytest.mark.parametrize("hf, first_sparse", [(DEEPSEEK_V3, 3), (KIMI_K2, 1)], ids=["deepseek_v3", "kimi_k2"])
def test_deepseek_v3_layouts_pass_the_zerodp_launch_check(tmp_path, monkeypatch, hf, first_sparse):
    """DeepSeek-V3 (8 groups of 32 experts, 3 dense layers, an MTP layer past num_hidden_layers) and Kimi-K2 (one group
    of 384 experts, 1 dense layer) are accepted by ZeroDP; their MoE layers are SGLang's (`first_k_dense_replace` on,
    the MTP layer not among them); SiDP and Shift refuse them as MoE."""
    import argparse

    monkeypatch.setattr("sgl_sidp.peer.topology.visible_gpu_count", lambda: 8)
    (tmp_path / "config.json").write_text(json.dumps(hf))
    assert moe_layer_ids(hf) == list(range(first_sparse, 61))

    def launch(*flags, dp=2):
        p = argparse.ArgumentParser()
        SidpConfig.add_cli_args(p)
        raw = SimpleNamespace(model_path=str(tmp_path), dp_size=dp, tp_size=8, base_gpu_id=0, gpu_id_step=1)
        SidpConfig.from_cli_args(p.parse_args(list(flags))).validate_against(raw)

    launch("--overlay-mode", "zerodp")
    launch("--overlay-mode", "zerodp", "--zerodp-layers", f"{first_sparse},60")
    with pytest.raises(SidpConfigError) as e:
        launch("--overlay-mode", "zerodp", "--zerodp-layers", "0,61")
    assert e.value.problems == [f"--zerodp-layers names layers the model has no MoE experts in: [0, 61] (its MoE "
                                f"layers: {first_sparse}-60)"]
    for mode, dp in (("sidp", 2), ("shift", 1)):
        with pytest.raises(SidpConfigError) as e:
            launch("--overlay-mode", mode, dp=dp)
        assert "is MoE" in e.value.problems[0], e.value.problems  # (Shift also refuses the FP8 weights)


def test_zerodp_refuses_a_deepseek_config_whose_layers_are_all_dense(tmp_path):
    """first_k_dense_replace at or past num_hidden_layers: SGLang builds no FusedMoE, so ZeroDP refuses at launch
    instead of failing when a sink finds nothing to share."""
    import argparse

    (tmp_path / "config.json").write_text(json.dumps({**DEEPSEEK_V3, "first_k_dense_replace": 61}))
    p = argparse.ArgumentParser()
    SidpConfig.add_cli_args(p)
    raw = SimpleNamespace(model_path=str(tmp_path), dp_size=2, tp_size=8, base_gpu_id=0, gpu_id_step=1)
    with pytest.raises(SidpConfigError) as e:
        SidpConfig.from_cli_args(p.parse_args(["--overlay-mode", "zerodp"])).validate_against(raw)
    assert e.value.problems == [f"--overlay-mode zerodp offloads MoE expert weights, but no decoder layer of "
                                f"{tmp_path} holds experts (first_k_dense_replace 61, moe_layer_freq 1, 61 layers)"]
