"""`peer.exchange.SymmetricExchange` on CPU processes (gloo), its symmetric memory file-backed (`tests/file_symm.py`):
the same blocks as an all-to-all, slots that alternate, blocks beyond the buffer handed back."""

import pytest
import torch
import torch.distributed as dist

from sgl_sidp.peer.exchange import ExchangeError, SymmetricExchange
from tests.file_symm import FileSymm
from tests.gloo_procs import spawn


def _rank(rank, world, folder):
    ex = SymmetricExchange(None, rank, world, 3 * world * 4, torch.float64, "cpu", symm=FileSymm(folder, rank))
    ok = []
    for step in range(4):  # slots 0, 1, 0, 1; each result read before that slot's next exchange
        n = 2 + step % 2
        send = torch.randn(world, n, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(10 * step + rank))
        want = torch.empty_like(send)
        dist.all_to_all_single(want.view(-1), send.view(-1))
        got = ex.exchange(send, step % 2)
        ok.append(bool(torch.equal(got, want)))
    big = ex.exchange(torch.zeros(world, 5, 3, dtype=torch.float64), 0)  # 5 rows x 3 > 3 x 4 elements a block
    try:
        ex.exchange(torch.zeros(world + 1, 1, 3, dtype=torch.float64), 0)
        wrong = None
    except ValueError as e:
        wrong = str(e)
    return ok, big is None, wrong, ex.exchanges, ex.nbytes


@pytest.mark.parametrize("world", [2, 3])
def test_copies_into_the_peers_buffers_are_an_all_to_all(tmp_path, world):
    for rank, (ok, handed_back, wrong, n, nbytes) in spawn(_rank, world, str(tmp_path)).items():
        assert ok == [True] * 4, rank
        assert handed_back and n == 4 and nbytes == 2 * 3 * world * 4 * 8
        assert wrong == f"exchange: blocks ({world + 1}, 1, 3) torch.float64, the group has {world} GPUs and a " \
                        "torch.float64 buffer"


def test_a_group_without_symmetric_memory_is_one_error_line():
    class NoP2P:
        @staticmethod
        def empty(n, dtype=None, device=None):
            raise RuntimeError("CUDA driver does not support P2P")

    with pytest.raises(ExchangeError, match="^torch symmetric memory over 2 GPUs: RuntimeError: CUDA driver does "
                                            "not support P2P$"):
        SymmetricExchange(None, 0, 2, 16, torch.bfloat16, "cpu", symm=NoP2P())
