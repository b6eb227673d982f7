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
        ok.append(bool(torch.equal(got, want)) and not ex.pending)
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


def _held_rank(rank, world, folder):
    ex = SymmetricExchange(None, rank, world, world * 4, torch.float64, "cpu", symm=FileSymm(folder, rank))
    peer = (rank + 1) % world
    src = torch.full((4,), float(rank), dtype=torch.float64)
    ex.put(src, ex.view(peer, 0, (world, 4))[rank])
    held = len(ex.pending) == 1 and ex.pending[0] is src
    ex.barrier()
    return held, not ex.pending, ex.view(rank, 0, (world, 4))[(rank - 1) % world].tolist()


def test_a_put_source_is_held_until_the_barrier_joins_its_copy(tmp_path):
    """A temporary put by a caller (Shift's peers' QKV blocks at SP > 2) is freed only after the barrier: on GPU its
    copy runs on a side stream, and an earlier free would hand its memory to the next GEMM while the copy reads it."""
    for rank, (held, released, got) in spawn(_held_rank, 2, str(tmp_path)).items():
        assert held and released and got == [float(1 - rank)] * 4, rank
