"""Shift Parallelism's flags (`--shift-*`), as the `shift` part of `sgl_sidp.config.SidpConfig`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class ShiftSettings(BaseModel):
    """Shift Parallelism's settings; each field is the flag `--shift-<field>`."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)  # inf/nan: refused

    sp: int = Field(
        0, ge=0,
        description="SP of the base configuration (SP, TP = P / SP) over the P = --tp-size GPUs; must divide P. "
        "0: the largest SP whose base weights (the linears split P / SP ways) leave KV room for one chunked prefill "
        "on these GPUs (SP = P where the model fits; a given SP that does not fit is refused). SP = 1 makes the "
        "base configuration TP = P on the overlay's own GEMMs (a check of the wiring on any GPU count, no sequence "
        "parallelism).",
    )
    threshold: int = Field(
        0, ge=0,
        description="Tokens in a forward (after radix-cache admission; a CUDA graph's captured size) above which "
        "it runs the base configuration (Ulysses SP); at or below it the shift configuration (TP = P). 0: from "
        "start-up calibration (SGLang's dummy prefill bodies timed in both configurations before any CUDA graph is "
        "captured, so every graph is captured with it; cached on disk for the next start).",
    )
    all_to_all: Literal["nccl", "overlap"] = Field(
        "overlap",
        description="How the base configuration's two exchanges per layer move their blocks. nccl: SGLang's pynccl "
        "all_to_all_single after the QKV GEMM and before the O GEMM (kernels on the SMs, nothing overlaps). "
        "overlap: each GPU computes its SP peers' QKV blocks first and copies them into their memory with the copy "
        "engines (torch symmetric memory) while it computes its own, and sends the attention output likewise "
        "behind the O GEMM of its own heads; a receive buffer of twice the QKV blocks of a chunked prefill per GPU, "
        "larger forwards by NCCL; --shift-exact keeps NCCL. Measured on H200 (benchmarks/results/multi_gpu/"
        "a2a_overlap_4gpu_h200 and the q8_overlap, q32_overlap runs): overlap's base prefill of 8,192 tokens 127 ms "
        "against NCCL's 134 on Qwen3-8B SP2, 258 against 269 on Qwen3-32B SP4; bursts 1.025-1.035x.",
    )
    exact: bool = Field(
        False,
        description="The base configuration rounds as TP = P does: every linear as its P TP shards' GEMMs, a "
        "row-parallel layer's partial sums added in TP-rank order in fp32 and rounded once, as SGLang's all-reduce "
        "adds two of them (at P > 2 SGLang's all-reduce may add in another order). Costs SP GEMMs per linear instead "
        "of one and, at TP_b > 1, an all-gather of the partial sums in place of the TP_b all-reduce.",
    )
