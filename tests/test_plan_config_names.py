"""Configuration names with options (`plan.configs.configuration_named`): what `bench.compare --configs` and the
planner's `launch_flags` start."""

import pytest

from sgl_sidp.calibration.memory import ModelShapes
from sgl_sidp.plan.configs import Configuration, configuration_named, configurations

DENSE = {"architectures": ["Qwen3ForCausalLM"], "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 4,
         "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64, "vocab_size": 4096}


@pytest.mark.parametrize("n", [2, 4, 8])
def test_every_planner_name_reads_back_as_its_configuration(n):
    for c in configurations(ModelShapes.of(DENSE), n):
        assert configuration_named(c.name) == c


@pytest.mark.parametrize("name, technique, flags", [
    ("tp2", "vanilla", ["--tp-size", "2"]),
    ("tp2_dp2", "vanilla", ["--tp-size", "2", "--dp-size", "2"]),
    ("dp4_attn_ep", "dp_attention", ["--tp-size", "4", "--dp-size", "4", "--enable-dp-attention", "--ep-size", "4"]),
    ("zerodp_dp4_all", "zerodp", ["--dp-size", "4", "--overlay-mode", "zerodp", "--zerodp-layers", "all"]),
    ("zerodp_dp2_pf8192", "zerodp", ["--dp-size", "2", "--overlay-mode", "zerodp", "--zerodp-expected-batch",
                                     "prefill:8192"]),
    ("zerodp_dp2_kv4096", "zerodp", ["--dp-size", "2", "--overlay-mode", "zerodp", "--zerodp-expected-batch",
                                     "kv:4096"]),
    ("sidp_dp2_cas_eager", "sidp", ["--dp-size", "2", "--overlay-mode", "sidp", "--sidp-service", "cas",
                                    "--no-sidp-cas-graphs"]),
    ("sidp_dp2_tp2_cas_graphs", "sidp", ["--tp-size", "2", "--dp-size", "2", "--overlay-mode", "sidp",
                                         "--sidp-service", "cas", "--sidp-cas-graphs"]),
    ("sidp_dp2_auto_bth64", "sidp", ["--dp-size", "2", "--overlay-mode", "sidp", "--sidp-service", "auto",
                                     "--sidp-b-th", "64"]),
    ("sidp_dp2_auto_measured", "sidp", ["--dp-size", "2", "--overlay-mode", "sidp", "--sidp-service", "auto",
                                        "--sidp-b-th-measure"]),
    ("shift_sp2_tp2_th1", "shift", ["--tp-size", "4", "--overlay-mode", "shift", "--shift-sp", "2",
                                    "--shift-threshold", "1"]),
    ("shift_sp2_tp1_th1_exact", "shift", ["--tp-size", "2", "--overlay-mode", "shift", "--shift-sp", "2",
                                          "--shift-threshold", "1", "--shift-exact"]),
    ("shift_sp2_tp1_overlap", "shift", ["--tp-size", "2", "--overlay-mode", "shift", "--shift-sp", "2",
                                        "--shift-all-to-all", "overlap"]),
])
def test_options_become_launch_flags(name, technique, flags):
    c = configuration_named(name)
    assert (c.technique, c.launch_flags()) == (technique, flags)
    assert c.launcher == ("sglang.launch_server" if technique in ("vanilla", "dp_attention") else "sgl_sidp.launch_server")


def test_an_option_wins_over_the_cost_models_decision_and_the_base_name_drops_it():
    c = configuration_named("sidp_dp2_auto_graphs_bth8")
    assert c.base_name == "sidp_dp2_auto" and c.options == ("graphs", "bth8")
    assert c.launch_flags(b_th=96)[-3:] == ["--sidp-b-th", "8", "--sidp-cas-graphs"]
    assert configuration_named("shift_sp4_tp1").gpus == 4 and configuration_named("dp4_attn").server_tp == 4


@pytest.mark.parametrize("name, says", [
    ("tp", "expected tpT"), ("sidp_dp2_was_bth8", "auto's"), ("sidp_dp2_cas_measured", "auto's"),
    ("sidp_dp2_auto_bth8_measured", "name one"), ("zerodp_dp2_graphs", "no option 'graphs'"),
    ("shift_sp2_tp1_th", "needs a number"), ("zerodp_dp2_all3", "takes no number"), ("zerodp_dp2_pf", "needs a number"), ("dp0", "at least 1"),
])
def test_bad_names_are_refused_with_the_reason(name, says):
    with pytest.raises(ValueError, match=says):
        configuration_named(name)


def test_plain_configurations_keep_no_options():
    assert Configuration("tp2", "vanilla", 1, 2).base_name == "tp2"


def test_shift_names_one_exchange():
    assert configuration_named("shift_sp2_tp1_nccl").launch_flags()[-2:] == ["--shift-all-to-all", "nccl"]
    with pytest.raises(ValueError, match="^configuration shift_sp2_tp1_nccl_overlap: nccl and overlap are two ways "
                                         "of one exchange; name one$"):
        configuration_named("shift_sp2_tp1_nccl_overlap")
