"""What a shared tensor is, as both processes describe it: the unit the peer transport hands over."""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One shared per-layer tensor (e.g. an MoE layer's `w13_weight`), as owner and reader describe it.

    Attributes:
        layer_id: the decoder layer index (`FusedMoE.layer_id`).
        name: the parameter name inside `FusedMoE`, e.g. "w13_weight".
        shape: the local (per TP rank) shape, e.g. (128, 1536, 2048) for Qwen3-30B-A3B w13 at TP=1.
        dtype: `str(torch.dtype)`, e.g. "torch.bfloat16".
        nbytes: bytes of the tensor.
    """

    layer_id: int
    name: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int

    @property
    def key(self) -> tuple[int, str]:
        return (self.layer_id, self.name)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Mapping) -> "TensorSpec":
        return cls(int(d["layer_id"]), str(d["name"]), tuple(int(x) for x in d["shape"]), str(d["dtype"]), int(d["nbytes"]))


def manifest_mismatches(owner: Sequence[TensorSpec], reader: Sequence[TensorSpec]) -> list[str]:
    """Every disagreement between the owner's and the reader's tensors, one line each.

    Fail-closed input for the reader: any line means it must not start. (ZeroDP: owner = source,
    reader = sink.)
    """
    src = {t.key: t for t in owner}
    snk = {t.key: t for t in reader}
    problems = []
    for key in sorted(set(src) | set(snk)):
        a, b = src.get(key), snk.get(key)
        where = f"layer {key[0]} {key[1]}"
        if a is None:
            problems.append(f"{where}: the reader has it, the owner does not")
        elif b is None:
            problems.append(f"{where}: the owner has it, the reader does not")
        else:
            if a.shape != b.shape:
                problems.append(f"{where}: shape {a.shape} on the owner, {b.shape} on the reader")
            if a.dtype != b.dtype:
                problems.append(f"{where}: dtype {a.dtype} on the owner, {b.dtype} on the reader")
    return problems
