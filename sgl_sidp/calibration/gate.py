"""`--overlay-start-after FILE`: a scheduler process waits for a file before it takes GPU memory.

`python -m sgl_sidp.plan calibrate` times a model's shards one server at a time on one GPU. A server spends its first
20-30 s on the CPU (imports, tokenizer manager, scheduler spawn); starting the next shard's server with this gate
while the current one is timed overlaps that with the measurement, and the gate opens (the file appears) once the
current server has stopped, so the next one sizes its KV pool from a GPU nobody else holds, as a lone server does.
On reaching its gate a scheduler makes `reached(FILE)`: `plan calibrate` starts its second waiting server only once
the first server did, so that fewer start-ups share the CPU with the first one (three at once took a warm H200 host
54 s to the first one's GPU start, one alone 22 s).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

logger = logging.getLogger(__name__)

#: how long a scheduler waits for the file before it stops (s)
GATE_TIMEOUT_S = 1800.0


def reached(path) -> Path:
    """The file a scheduler makes when it reaches its gate `path` (its CPU start-up done)."""
    return Path(f"{path}.reached")


class StartGate:
    """The runtime of the `ModelRunner.init_torch_distributed` BEFORE hook: waits until `path` exists.

    SGLang's `ModelRunner.init_torch_distributed` reads the free GPU memory before the model loads
    (`pre_model_load_memory`), the first reading its KV-pool sizing uses; nothing before it in a scheduler process
    allocates GPU memory beyond the CUDA context.

    Args:
        ctx: the plugin's per-process context (`ctx.config.start_after`: the file), or None with `path` given.
        path: the file (tests).
        timeout_s: how long to wait.
        poll_s: seconds between two looks.
    """

    def __init__(self, ctx=None, path: str | None = None, timeout_s: float = GATE_TIMEOUT_S, poll_s: float = 0.2):
        self.path = path if path is not None else ctx.config.start_after
        self.timeout_s, self.poll_s = timeout_s, poll_s

    def wait(self, *args, **kwargs):
        """BEFORE hook of `ModelRunner.init_torch_distributed(self)`: make `reached(path)`, return once `path` exists.

        Returns:
            (args, kwargs) unchanged.

        Raises:
            RuntimeError: the file did not appear within `timeout_s` (SGLang stops the server and names this
                scheduler).
        """
        t0 = time.monotonic()
        reached(self.path).touch()
        if not os.path.exists(self.path):
            logger.info("sgl-sidp: waiting for %s before taking GPU memory (--overlay-start-after)", self.path)
        while not os.path.exists(self.path):
            if time.monotonic() - t0 > self.timeout_s:
                raise RuntimeError(f"--overlay-start-after: {self.path} did not appear within {self.timeout_s:.0f} s")
            time.sleep(self.poll_s)
        if time.monotonic() - t0 > self.poll_s:
            logger.info("sgl-sidp: %s appeared after %.1f s; starting on the GPU", self.path, time.monotonic() - t0)
        return args, kwargs
