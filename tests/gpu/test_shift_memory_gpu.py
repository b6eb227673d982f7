"""Shift's base weights on one real GPU (`pytest -m gpu`): gathering them leaves no memory reserved and unused.

`ShiftRuntime.adopt` gathers each decoder linear's base weight from the TP = P shards (`views.rebase`); SGLang then
sizes the KV cache from the free memory. On 4 x H200, Llama-3.1-70B at SP2 x TP2 got about 4.4 GiB fewer KV bytes a
GPU than its weights leave (715,449 KV tokens, the planner 787,363): the caching allocator had split the freed shards'
and gathers' blocks for later base weights and kept the rest reserved. Here the same gathers run on one GPU with
Llama-3.1-70B's TP4 shapes (a copying stand-in for the SP group's all-gather, SP = 2) and the reserved-but-unallocated
bytes are measured with the old order (no release) and with `rebase`.
"""

import pytest
from memory import slack_gib

pytestmark = [pytest.mark.gpu]

#: Llama-3.1-70B's decoder linears at TP4, [rows, cols] of each shard, and whether the base gathers rows or columns
SHARDS = (((8192 + 2 * 1024) // 4, 8192, "column"), (8192, 8192 // 4, "row"),
          (2 * 28672 // 4, 8192, "column"), (8192, 28672 // 4, "row"))


class CopyComm:
    """`all_gather_into_tensor` of one process standing in for SP ranks that hold the same shard."""

    @staticmethod
    def all_gather_into_tensor(output, input):
        for part in output.chunk(output.shape[0] // input.shape[0]):
            part.copy_(input)


def _base_weights(layers: int, release: bool):
    """Llama-3.1-70B's TP4 shards of `layers` layers gathered into base weights: with `views.rebase`, or (not
    `release`) as before it, `gather_base` and `shard_view` alone. Returns (shards, base weights)."""
    import torch

    from sgl_sidp.shift.views import COLUMN, ROW, gather_base, rebase, shard_view

    params = [torch.nn.Parameter(torch.empty(r, c, dtype=torch.bfloat16, device="cuda"), requires_grad=False)
              for _ in range(layers) for r, c, _ in SHARDS]
    dims = [COLUMN if d == "column" else ROW for _ in range(layers) for _, _, d in SHARDS]
    torch.cuda.synchronize()
    bases = []
    for p, dim in zip(params, dims):
        if release:
            bases.append(rebase(p, dim, 2, 0, CopyComm))
        else:
            bases.append(gather_base(p.data, dim, 2, CopyComm))
            p.data = shard_view(bases[-1], dim, 2, 0)
    return params, bases


@pytest.mark.gpus(1)
def test_gathering_the_base_weights_leaves_nothing_reserved(capsys):
    layers = 30  # 12.8 GB of TP4 shards and 25.7 GB of base weights: fits an 80 GB GPU
    old, new = (slack_gib(lambda: _base_weights(layers, release)) for release in (False, True))
    with capsys.disabled():
        print(f"\nreserved but unallocated after gathering {layers} layers: {old:.2f} GiB without release, "
              f"{new:.2f} GiB with views.rebase")
    assert new < 0.25, new
