"""scripts/sidp_compare.py, retired into `python -m sgl_sidp.bench.compare`: its old configurations and offline job
mapped onto compare's names and burst, what compare cannot run refused before anything starts."""

import runpy
from pathlib import Path

import pytest

from sgl_sidp.plan.configs import configuration_named

MOD = runpy.run_path(str(Path(__file__).resolve().parents[1] / "scripts/sidp_compare.py"))


def mapped(*argv):
    return MOD["compare_args"](MOD["parser"]().parse_args(["--out-dir", "OUT", *argv]))


@pytest.mark.parametrize("d,t,names", [
    (2, 1, "dp2,dp2_attn,tp2,tp1,sidp_dp2_was,sidp_dp2_cas,sidp_dp2_auto_bth64"),
    (4, 2, "tp2_dp4,tp8,tp1,sidp_dp4_tp2_was,sidp_dp4_tp2_cas,sidp_dp4_tp2_auto_bth64")])
def test_configurations_scale_with_dp_and_tp(d, t, names):
    old = "dp,dp_attn,tp,tp1,sidp_was,sidp_cas,sidp_auto" if t == 1 else "dp,tp,tp1,sidp_was,sidp_cas,sidp_auto"
    argv = mapped("--configs", old, "--dp", str(d), "--tp", str(t), "--b-th", "64")
    assert argv[argv.index("--configs") + 1] == names
    for name, old_name in zip(names.split(","), old.split(",")):
        c = configuration_named(name)
        assert c.gpus == (1 if old_name == "tp1" else d * t)
        assert (c.dp, c.tp) == {"tp": (1, d * t), "tp1": (1, 1), "dp_attn": (d, 1)}.get(old_name, (d, t))
    assert configuration_named("sidp_dp2_auto_bth64").launch_flags()[-2:] == ["--sidp-b-th", "64"]
    assert "sidp_dp2_auto" in mapped("--configs", "sidp_auto")  # no --b-th: the launcher's own


def test_one_job_with_its_requests_is_the_burst():
    argv = mapped("--configs", "dp", "--jobs", "768+256", "--requests", "512", "--mem-fraction-static", "0.5")
    assert argv[-2:] == ["--burst", "512+768+256"]
    assert "--extra-args=--attention-backend triton --sampling-backend pytorch --mem-fraction-static 0.5" in argv
    with pytest.raises(ValueError, match="without --requests"):
        mapped("--jobs", "768+256")
    with pytest.raises(ValueError, match="one burst a call"):
        mapped("--jobs", "768+256,1536+512", "--requests", "8")


@pytest.mark.parametrize("argv,why", [(["--configs", "dp,sidp_was_unshifted"], "--sidp-fetch-order forward"),
                                      (["--configs", "dp_attn", "--tp", "2"], "DP attention over all N GPUs"),
                                      (["--configs", "dp3"], "unknown configuration 'dp3'")])
def test_what_compare_cannot_run_is_refused_before_anything(argv, why, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        MOD["main"](["--out-dir", str(tmp_path), *argv])
    assert e.value.code == 2 and why in capsys.readouterr().err and not list(tmp_path.iterdir())


def test_print_only_says_the_step_sweep_is_gone(capsys):
    assert MOD["main"](["--out-dir", "OUT", "--configs", "tp1", "--step-batches", "1,16", "--print-only"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "sidp_compare.py: --step-batches ignored: bench.compare has no decode-step sweep"
    assert "--configs tp1" in out[1] and "--burst" not in out[1]
