"""ZeroDP's flags (`--zerodp-*`), as the `zerodp` part of `sgl_sidp.config.SidpConfig`."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator


class ZeroDPSettings(BaseModel):
    """ZeroDP's settings; each field is the flag `--zerodp-<field>`."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)  # inf/nan: refused

    tensors: str = Field(
        "w13,w2",
        pattern=r"^(w13|w2)(,(w13|w2))?$",
        json_schema_extra={"metavar": "w13,w2|w13|w2"},
        description="Expert tensor groups a sink may pull from the source: 'w13,w2' (both), 'w13' or 'w2'.",
    )
    layers: str = Field(
        "auto",
        pattern=r"^(auto|all|every:[1-9][0-9]*|[0-9]+(,[0-9]+)*)$",
        json_schema_extra={"metavar": "auto|all|every:K|3,7,11"},
        description="Offloaded MoE layers: 'auto' (the policy, sized for --zerodp-expected-batch), 'all', "
        "'every:K' (every K-th MoE layer) or a list '3,7,11'.",
    )
    expected_batch: str = Field(
        "decode:1",
        pattern=r"^(decode|prefill|kv):[1-9][0-9]*$",
        json_schema_extra={"metavar": "decode:N|prefill:T|kv:C"},
        description="The load the policy sizes the offload for. 'decode:N' (N sequences) or 'prefill:T' (T tokens "
        "per forward): the most layers whose copies fit in that forward; the default decode:1 keeps a sink as fast "
        "as vanilla at any load. 'kv:C' assumes a queue that never drains: decode of as many C-token sequences as "
        "the sink's KV cache holds, every step; it picks the offload that maximizes modeled decode tokens/s (none "
        "unless it wins by 10%%). It does not model a draining batch (a finite job, light load), where an offloading "
        "sink stays copy-bound and runs slower than vanilla (measured 0.70x on a finite decode batch).",
    )
    calibration: str | None = Field(
        None,
        json_schema_extra={"metavar": "PATH"},
        description="Calibration JSON (forward times per batch, copy rates) that overrides the bundled table and the "
        "start-up measurement. Default: the bundled file for this model and GPU if any, else the cached start-up "
        "calibration, else one measured by the source at its first start.",
    )
    source_timeout_s: float = Field(
        900.0, gt=0, description="Seconds a sink waits for its source to publish its expert weights (and, on a "
        "first start, its calibration)."
    )

    @field_validator("tensors", "layers")
    @classmethod
    def _no_repeats(cls, value: str) -> str:
        items = value.split(",")
        repeated = sorted({x for x in items if items.count(x) > 1})
        if repeated:
            raise ValueError(f"names {', '.join(repeated)} more than once")
        return value
