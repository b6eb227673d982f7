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
        2, ge=1, le=8,
        description="WaS slots per rank: layers' weights in flight or in use at once (each slot holds one FFN "
        "layer's gate_up and down weights of this TP rank).",
    )
    owner_timeout_s: float = Field(
        900.0, gt=0,
        description="Seconds a rank waits for the other ranks to publish the FFN layers they own (they may still "
        "be loading weights).",
    )
