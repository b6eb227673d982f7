"""SGLang's own ways of running a model, as planner techniques (`technique.Technique`): vanilla TP x DP (`tp{t}`,
`dp{d}`, `tp{t}_dp{d}`) and DP attention (`dp{n}_attn`: attention data-parallel, the FFN TP over all GPUs)."""

from __future__ import annotations

import math

from sgl_sidp.plan.technique import Technique


class Vanilla(Technique):
    """TP t x DP d: d independent replicas of TP t (the defaults of `Technique`)."""

    name = "vanilla"
    patterns = (r"tp(?P<tp>\d+)", r"dp(?P<dp>\d+)", r"tp(?P<tp>\d+)_dp(?P<dp>\d+)")
    form = "tpT, dpD, tpT_dpD"
    vanilla = True

    def split_configurations(self, shapes, n_gpus, dp, tp):
        from sgl_sidp.plan.configs import Configuration

        return [Configuration(f"tp{tp}" if dp == 1 else f"dp{dp}" if tp == 1 else f"tp{tp}_dp{dp}", self.name, dp, tp)]


class DPAttention(Technique):
    """SGLang's `--enable-dp-attention` over N GPUs: whole attention per rank (each its own KV cache), the FFN split N
    ways over every rank's tokens."""

    name = "dp_attention"
    patterns = (r"dp(?P<dp>\d+)_attn",)
    form = "dpN_attn[_ep]"
    options = {"ep": "expert parallelism over the DP ranks' GPUs (--ep-size N)"}
    #: EP is priced as the FFN split N ways (the same per GPU: E/N whole experts instead of every expert's 1/N, the
    #: same FLOPs and weight bytes, inside the same gather and reduce-scatter of SGLang's `moe_a2a_backend='none'`);
    #: measured on 2 x H200, Qwen3-30B-A3B, EP ran 0.91x DP attention's throughput on 256 x (2,048, 256) and 1.05x
    #: on 64 x (8,192, 16) (benchmarks/results/multi_gpu/q30_ep_*), which this price does not see
    modeled_options = frozenset({"ep"})
    vanilla = True

    def node_configurations(self, shapes, n_gpus):
        from sgl_sidp.plan.configs import Configuration

        return [Configuration(f"dp{n_gpus}_attn", self.name, n_gpus, 1)] if n_gpus > 1 else []

    #: dense architectures whose DP attention server SGLang 0.5.17 does not start (measured): while capturing its
    #: CUDA graphs each rank fails in `set_kv_buffer` ("view size is not compatible with input tensor's size and
    #: stride"), Llama-3.1-70B on 2 x H200 and 4 x H100 (benchmarks/results/multi_gpu/l70_prefill_*)
    FAILS_IN_SGLANG = {"LlamaForCausalLM"}

    def known_failure(self, c, hf):
        from sgl_sidp.model_info import has_experts

        if "ep" in c.options and not has_experts(hf):
            return "expert parallelism needs an MoE model"
        arch = (hf.get("architectures") or [""])[0]
        if arch in self.FAILS_IN_SGLANG:
            return (f"SGLang 0.5.17 does not start DP attention on {arch} (triton attention): set_kv_buffer fails "
                    "while capturing (measured on 2 x H200 and 4 x H100)")
        return None

    def server_tp(self, c):
        return c.gpus

    def attn_tp(self, c):
        return 1

    def dp_attention_dp(self, c):
        return c.dp

    def launch_flags(self, c, opts, b_th, shift_threshold):
        return (["--tp-size", str(c.dp), "--dp-size", str(c.dp), "--enable-dp-attention"]
                + (["--ep-size", str(c.dp)] if "ep" in opts else []))

    def shards(self, c, shapes):
        from sgl_sidp.plan.configs import shard_of

        return {"forward": shard_of(shapes, 1, c.gpus, c.gpus)}

    def weight_bytes_per_gpu(self, c, shapes, elt, sink_offload, slots, chunk):
        # the embedding whole, the lm_head TP over all GPUs (no --enable-dp-lm-head)
        return {"gpu": shapes.weight_bytes(attn_tp=1, mlp_tp=c.gpus, vocab_tp=1, elt=elt, head_tp=c.gpus)}

    def total_kv_tokens(self, c, kv):
        return kv["gpu"] * c.gpus

    def terms(self, model, size, role, variant, prefill=False):
        # whole attention, no TP all-reduce; the FFN gathered from every GPU
        n = model.config.gpus
        return (model.clock, 1, *model._gathered_terms(size, n, model.gathered_ffn_share(n)), 0.0, -math.inf)

    def replicas(self, model, kv):
        from sgl_sidp.plan.steps import Replica

        return [Replica(model.step_times(), kv["gpu"]) for _ in range(model.config.gpus)]

    def lockstep(self, c):
        """SGLang's DP attention syncs its ranks every iteration (the MLP sync, `scheduler_components/dp_attn.py`)."""
        return True


VANILLA = Vanilla()
DP_ATTENTION = DPAttention()
