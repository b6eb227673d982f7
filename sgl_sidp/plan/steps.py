"""A configuration's step times, predicted: its shard's forward times measured on one GPU (a calibration, looked up by
the shard's model signature) plus the collectives the configuration adds (`comm.Interconnect`).

Modelled so far: vanilla TP x DP. Per decode step or prefill forward a TP group all-reduces the hidden states twice
per layer (after attention and after the FFN: `tokens x hidden x 2` bytes); the shard's own forward is what one GPU
measured at TP1 with the shard's sizes. DP replicas run independently. The other techniques (DP attention, ZeroDP,
SiDP, Shift) are listed by the planner as not modelled yet.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Mapping

from sgl_sidp.calibration.cache import BUNDLED_DIR, default_cache_dir
from sgl_sidp.calibration.memory import ModelShapes
from sgl_sidp.calibration.table import Calibration
from sgl_sidp.model_info import model_signature
from sgl_sidp.plan.comm import Interconnect
from sgl_sidp.plan.configs import Configuration, Shard
from sgl_sidp.plan.sim import StepTimes

#: GPU kinds the planner knows: NVML's total MiB, and the free GiB SGLang logged before loading a model at TP1.
GPUS = {"H200": {"name": "NVIDIA H200", "mib": 143_771, "free_before_load_gib": 139.13,
                 "source": "SGLang's 'Load weight begin. avail mem' at TP1, benchmarks/results/sidp/calibration_1gpu/"},
        "H100": {"name": "NVIDIA H100 80GB HBM3", "mib": 81_559, "free_before_load_gib": 78.50,
                 "source": "SGLang's 'Load weight begin. avail mem' at TP1, benchmarks/results/families/ (DeepSeek-V2 run)"}}

MODELLED = ("vanilla",)


def shard_signature(hf: Mapping, shard: Shard) -> str:
    """The calibration signature (`model_info.model_signature` at TP1) of SGLang running `hf` with `shard`'s sizes."""
    cfg = dict(hf.get("text_config", hf))
    cfg.update(shard.override_args(ModelShapes.of(hf)))
    return model_signature(cfg, 1)


def find_calibration(signature: str, gpu_name: str, dirs: list[Path] | None = None) -> tuple[Calibration, Path] | None:
    """A calibration of `signature` on `gpu_name`: in the start-up cache (`$SIDP_CALIBRATION_DIR`) or bundled with the
    package, as cache entries (`{"key", "calibration"}`) or plain tables."""
    for d in dirs if dirs is not None else [default_cache_dir(), BUNDLED_DIR]:
        for f in sorted(Path(d).glob("*.json")):
            try:
                data = json.loads(f.read_text())
                cal = data.get("calibration", data)
                if cal.get("model") == signature and cal.get("gpu") == gpu_name:
                    return Calibration.from_json(cal), f
            except (OSError, ValueError, KeyError, AttributeError, TypeError):
                continue
    return None


@dataclasses.dataclass(frozen=True)
class StepModel:
    """Predicted forward times of one replica of `config`: `shard` timed on one GPU (`cal`) plus its TP group's
    all-reduces (`ic`)."""

    config: Configuration
    shapes: ModelShapes
    cal: Calibration
    ic: Interconnect
    elt: int = 2

    def _comm_ms(self, tokens: float) -> float:
        nbytes = tokens * self.shapes.hidden * self.elt
        return 2 * self.shapes.layers * self.ic.time_us("all_reduce", self.config.tp, nbytes) / 1e3

    def decode_ms(self, batch: float, context: float) -> float:
        per_token = self.shapes.kv_bytes_per_token(self.config.tp, self.elt)
        return self.cal.decode_step_ms(batch, int(context), per_token) + self._comm_ms(batch)

    @functools.cached_property
    def prefill_fit(self) -> tuple[float, float, float]:
        """(c ms, a ms per token, b ms per token^2) of one fresh request of T tokens taking c + a T + b T^2: the
        linear layers and the causal attention, least squares over the measured one-request prefills (the
        attention is what makes a batch of short prompts faster than one long prompt of the same tokens)."""
        import numpy as np

        xs = np.array(sorted(self.cal.prefill_ms), dtype=float)
        ys = np.array([self.cal.prefill_ms[int(x)] for x in xs])
        coef = np.linalg.lstsq(np.stack([np.ones_like(xs), xs, xs ** 2], 1), ys, rcond=None)[0]
        return tuple(float(max(0.0, v)) for v in coef)

    def prefill_ms(self, parts) -> float:
        """One prefill forward of `parts`, each request's (new tokens, tokens already in its KV): c + a x new tokens
        + b x each request's attention, new x (new + 2 x prefix) (`prefill_fit`), plus the TP all-reduces."""
        c, a, b = self.prefill_fit
        new = sum(n for n, _ in parts)
        return c + a * new + b * sum(n * (n + 2 * p) for n, p in parts) + self._comm_ms(new)

    def step_times(self) -> StepTimes:
        return StepTimes(self.decode_ms, self.prefill_ms)
