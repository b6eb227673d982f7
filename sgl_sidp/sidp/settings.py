"""SiDP's flags (`--sidp-sidp-*`), as the `sidp` part of `sgl_sidp.config.SidpConfig`."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SiDPSettings(BaseModel):
    """SiDP's settings; each field is the flag `--sidp-sidp-<field>`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    force: str = Field(
        "was",
        pattern=r"^(auto|was|cas)$",
        description="How a rank runs the FFN layers it does not own: 'was' (Weight-as-a-Service: stream the owner's "
        "weights into a slot ring, a few layers ahead). 'cas' (ship activations to the owner) and 'auto' (switch at "
        "B_th) are not built yet and are refused.",
    )
    slots: int = Field(
        0, ge=0, le=16,
        description="WaS slots per rank: layers' weights in flight or in use at once (each slot holds one FFN "
        "layer's gate_up and down weights of this TP rank). 0: d - 1 with d DP ranks, at least 2 (peak shifting "
        "needs d - 1).",
    )
    fetch_order: str = Field(
        "shifted",
        pattern=r"^(shifted|forward)$",
        description="Order a rank fetches a cycle of d layers in: 'shifted' (peak shifting: rank r starts after its "
        "own layer and wraps, so ranks read different owners at once; needs d - 1 slots, else forward) or "
        "'forward' (every rank in layer order, for comparison). The same for d = 2.",
    )
    owner_timeout_s: float = Field(
        900.0, gt=0,
        description="Seconds a rank waits for the other ranks to publish the FFN layers they own (they may still "
        "be loading weights).",
    )
