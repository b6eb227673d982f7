"""What PyTorch's caching allocator keeps reserved but unused, measured as SGLang would see it (GPU tests)."""

from typing import Callable


def slack_gib(build: Callable[[], object]) -> float:
    """GiB reserved by the caching allocator and not allocated after `build()` (what it returns is kept alive while
    measuring, then dropped), once the cache is emptied as SGLang's `get_available_gpu_memory` empties it before it
    reads the free memory that sizes the KV cache. The emptying calls `torch._C._cuda_emptyCache` directly, so a test
    may patch `torch.cuda.empty_cache` inside `build`."""
    import torch

    kept = build()
    torch.cuda.synchronize()
    torch._C._cuda_emptyCache()
    slack = (torch.cuda.memory_reserved() - torch.cuda.memory_allocated()) / 2 ** 30
    del kept
    torch._C._cuda_emptyCache()
    return slack
