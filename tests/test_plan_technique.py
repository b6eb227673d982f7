"""The planner's technique objects (`sgl_sidp.plan.technique`): one per way of running a model, each feature's in its
own folder, named by its `Feature.planner` (issue 36 item 6)."""

import ast
from pathlib import Path

import pytest

from sgl_sidp.features import FEATURES
from sgl_sidp.plan.configs import configuration_named
from sgl_sidp.plan.technique import PREFILL_HOST_MS_PER_LAYER, PREFILL_QUEUE_LAYERS, Technique, techniques

PACKAGE = Path(__file__).resolve().parents[1] / "sgl_sidp"


def test_techniques_are_vanilla_then_each_feature_in_the_table_order():
    assert list(techniques()) == ["vanilla", "dp_attention", *FEATURES]
    assert all(isinstance(t, Technique) and name == t.name for name, t in techniques().items())
    assert [n for n, t in techniques().items() if t.vanilla] == ["vanilla", "dp_attention"]


def test_each_feature_declares_its_planner_part_in_its_folder_importing_no_other_feature():
    for name, feature in FEATURES.items():
        module, _, attribute = feature.planner.partition(":")
        assert module == f"sgl_sidp.{name}.planner" and attribute
        tree = ast.parse((PACKAGE / name / "planner.py").read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
            a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        others = {m for m in imported if any(m.startswith(f"sgl_sidp.{o}") for o in FEATURES if o != name)}
        assert not others, f"{name}'s planner imports another feature: {others}"


def test_no_planner_module_branches_on_a_technique_name():
    for path in (PACKAGE / "plan").glob("*.py"):
        text = path.read_text()
        for branch in ("technique ==", "technique !=", "technique in (", 'if mode =='):
            assert branch not in text, f"{path.name}: {branch}"


def test_a_configuration_asks_its_technique():
    for name in ("tp2", "dp4_attn_ep", "zerodp_dp2_all", "sidp_dp2_auto_bth64", "shift_sp2_tp1_th1_exact"):
        c = configuration_named(name)
        assert c.kind is techniques()[c.technique]



@pytest.mark.parametrize("name, released", [("tp2", True), ("tp2_dp2", True), ("shift_sp2_tp1", True),
                                            ("shift_sp2_tp2", True), ("sidp_dp2_tp2_was", True), ("dp2", False),
                                            ("sidp_dp2_was", False), ("zerodp_dp2", False), ("dp2_attn", False),
                                            ("sidp_dp2_tp2_auto", False)])
def test_a_replica_of_several_gpus_releases_a_prefills_first_tokens_into_the_next(name, released):
    """`Technique.release`: measured on TP4 and TP2 replicas (Qwen3-32B, 64 layers: 0.72 of forwards over 83 ms);
    no delay on one GPU a replica (measured) and in lockstep."""
    c = configuration_named(name)
    share, min_ms = c.kind.release(c, 64)
    assert (share, min_ms) == ((1 - PREFILL_QUEUE_LAYERS / 64, PREFILL_HOST_MS_PER_LAYER * 64) if released else (0, 0))
    assert share == pytest.approx(0.72, abs=0.01) if released else share == 0
    assert c.kind.release(c, 12)[0] == 0  # a model of fewer layers than the queue holds: never late
