"""One validated settings object for everything the overlay adds to SGLang.

`SidpConfig` is parsed from the `--sidp-*` flags next to SGLang's own `ServerArgs`
flags (`add_cli_args` / `from_cli_args`), checked against those `ServerArgs`
(`validate_against`), and handed to every SGLang child process through one
environment variable (`to_env` / `from_env`), because SGLang's scheduler processes
are spawned and only inherit `os.environ`. The SGLang plugin (`sgl_sidp.plugin`)
reads it back in each process.

Every bad combination is reported as one line per problem, all at once, by
`SidpConfigError`, before SGLang allocates any GPU memory.
"""

from __future__ import annotations

import argparse
import enum
import json
import os
from pathlib import Path
from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError

#: Environment variable that carries the JSON-encoded `SidpConfig` to child processes.
ENV_VAR = "SIDP_CONFIG"


class SidpMode(str, enum.Enum):
    """Which weight-sharing technique the overlay runs."""

    OFF = "off"  # plain SGLang (the batch-signal observer may still be on)
    ZERODP = "zerodp"  # MoE experts pulled from a source DP replica (ZeroDP)
    SIDP = "sidp"  # dense FFNs owned per DP rank, WaS/CaS (SiDP)
    SHIFT = "shift"  # Ulysses SP <-> TP switching on one KV cache (Shift Parallelism)


#: Modes whose runtime exists in this version. The others are accepted by the
#: parser (so `--help` documents the whole product) but rejected by validation.
IMPLEMENTED_MODES = frozenset({SidpMode.OFF, SidpMode.ZERODP})


class SidpConfigError(ValueError):
    """Raised when the overlay's settings, alone or with SGLang's, are unusable.

    Attributes:
        problems: one human-readable line per problem found.
    """

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("invalid sgl-sidp settings:\n" + "\n".join(f"  - {p}" for p in self.problems))


class SidpConfig(BaseModel):
    """The overlay's settings (immutable).

    Fields mirror the `--sidp-*` flags (`--sidp-mode` -> `mode`, ...).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", use_enum_values=False)

    mode: SidpMode = Field(SidpMode.OFF, description="Weight-sharing technique: off, zerodp, sidp or shift.")
    batch_signal: bool = Field(
        False,
        description="Record the scheduler's per-iteration batch signal (batch size, tokens computed, "
        "radix-cache prefix-hit tokens) even when --sidp-mode is off. Always on in the other modes.",
    )
    signal_log_interval: int = Field(
        40,
        ge=1,
        description="Scheduler iterations between two batch-signal log lines "
        "(SGLang's --decode-log-interval defaults to 40 too).",
    )

    # ZeroDP (sgl_sidp.zerodp); ignored in the other modes.
    zerodp_tensors: str = Field(
        "w13,w2",
        pattern=r"^(w13|w2)(,(w13|w2))?$",
        description="Expert tensor groups a sink may pull from the source: 'w13,w2' (both), 'w13' or 'w2'.",
    )
    zerodp_layers: str = Field(
        "auto",
        pattern=r"^(auto|all|every:[1-9][0-9]*|[0-9]+(,[0-9]+)*)$",
        description="Offloaded MoE layers: 'auto' (the policy: the most whose copy fits under the forward "
        "time of --zerodp-expected-batch), 'all', 'every:K' (every K-th MoE layer) or a list '3,7,11'.",
    )
    zerodp_expected_batch: str = Field(
        "decode:1",
        pattern=r"^(decode|prefill|kv):[1-9][0-9]*$",
        description="The load the policy sizes the offload for. 'decode:N' (N sequences) or 'prefill:T' (T tokens "
        "per forward): the most layers whose copies fit in that forward; the default decode:1 keeps a sink as fast "
        "as vanilla at any load. 'kv:C': saturated serving, decode of as many C-token sequences as the sink's KV "
        "cache holds; the offload that maximizes modeled decode tokens/s, none unless it wins by 10%%.",
    )
    zerodp_calibration: str | None = Field(
        None,
        description="Calibration JSON with forward times per batch (scripts/zerodp_fetch_vs_compute.py); "
        "default: the bundled file matching the model and GPU.",
    )
    zerodp_source_timeout_s: float = Field(
        900.0, gt=0, description="Seconds a sink waits for its source to publish the expert weights."
    )

    # ------------------------------------------------------------------ derived
    @property
    def signal_enabled(self) -> bool:
        """True when the scheduler observer must run (explicitly asked, or needed by a mode)."""
        return self.batch_signal or self.mode != SidpMode.OFF

    @property
    def active(self) -> bool:
        """False means the plugin must be a strict no-op in every process."""
        return self.mode != SidpMode.OFF or self.batch_signal

    # ------------------------------------------------------------------ CLI
    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
        """Add the `--sidp-*` flags to `parser` in their own argument group.

        Flag defaults are None so that `from_cli_args` can tell "not given" from
        "given the default"; the model's defaults apply for anything not given.
        """
        fields = SidpConfig.model_fields
        group = parser.add_argument_group(
            "sgl-sidp overlay", "Weights shared across the GPUs of a node (ZeroDP, SiDP, Shift Parallelism)."
        )
        group.add_argument(
            "--sidp-mode",
            choices=[m.value for m in SidpMode],
            default=None,
            help=f"{fields['mode'].description} Default: off.",
        )
        group.add_argument(
            "--sidp-batch-signal",
            action="store_true",
            default=None,
            help=fields["batch_signal"].description,
        )
        group.add_argument(
            "--sidp-signal-log-interval",
            type=int,
            default=None,
            help=f"{fields['signal_log_interval'].description} Default: 40.",
        )
        for name in ("zerodp_tensors", "zerodp_layers", "zerodp_expected_batch", "zerodp_calibration", "zerodp_source_timeout_s"):
            field = fields[name]
            group.add_argument(
                "--sidp-" + name.replace("_", "-"),
                type=float if name.endswith("_s") else str,
                default=None,
                help=f"{field.description} Default: {field.default}.",
            )
        return group

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "SidpConfig":
        """Build the config from a namespace parsed with `add_cli_args`' flags.

        Raises:
            SidpConfigError: a flag value is out of range (one line per problem).
        """
        values = {
            name: getattr(args, f"sidp_{name}")
            for name in cls.model_fields
            if getattr(args, f"sidp_{name}", None) is not None
        }
        return cls.from_mapping(values)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "SidpConfig":
        """Validate a plain mapping (CLI values, decoded JSON) into a config.

        Raises:
            SidpConfigError: unknown keys or bad values, one line per problem.
        """
        try:
            return cls.model_validate(dict(values))
        except ValidationError as e:
            raise SidpConfigError(
                [f"--sidp-{'-'.join(str(p) for p in err['loc']).replace('_', '-')}: {err['msg']}" for err in e.errors()]
            ) from None

    # ------------------------------------------------------------------ env round trip
    def to_env(self, environ: dict | None = None) -> dict:
        """Store this config in `environ` (default `os.environ`) for child processes; returns it."""
        environ = os.environ if environ is None else environ
        environ[ENV_VAR] = self.model_dump_json()
        return environ

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "SidpConfig":
        """Read the config a parent process stored with `to_env`; the default (off) if none.

        Raises:
            SidpConfigError: the variable holds something that is not a valid config.
        """
        environ = os.environ if environ is None else environ
        raw = environ.get(ENV_VAR)
        if not raw:
            return cls()
        try:
            values = json.loads(raw)
        except json.JSONDecodeError as e:
            raise SidpConfigError([f"${ENV_VAR} is not JSON: {e}"]) from None
        return cls.from_mapping(values)

    # ------------------------------------------------------------------ cross-checks
    def validate_against(self, server_args: Any) -> None:
        """Check this config against SGLang's `ServerArgs`; CPU-only, reads at most a config.json.

        Args:
            server_args: a `sglang.srt.server_args.ServerArgs` (or any object with
                `model_path`, `dp_size`, `tp_size`).

        Raises:
            SidpConfigError: every problem found, one line each.
        """
        problems: list[str] = []
        mode = self.mode
        if mode == SidpMode.OFF:
            return
        if mode not in IMPLEMENTED_MODES:
            problems.append(f"--sidp-mode {mode.value} is not implemented in this version of sgl-sidp yet")
        dp, tp = int(getattr(server_args, "dp_size", 1) or 1), int(getattr(server_args, "tp_size", 1) or 1)
        if mode in (SidpMode.ZERODP, SidpMode.SIDP) and dp < 2:
            role = "a source and at least one sink" if mode == SidpMode.ZERODP else "at least two FFN owners"
            problems.append(f"--sidp-mode {mode.value} shares weights across DP replicas: needs --dp-size >= 2 ({role}), got {dp}")
        if mode == SidpMode.SHIFT and tp < 2:
            problems.append(f"--sidp-mode shift switches between SP and TP inside one replica: needs --tp-size >= 2, got {tp}")
        if mode in (SidpMode.ZERODP, SidpMode.SIDP):
            is_moe = model_is_moe(server_args.model_path)
            if mode == SidpMode.ZERODP and is_moe is False:
                problems.append(
                    f"--sidp-mode zerodp offloads MoE expert weights, but {server_args.model_path} has no MoE layers "
                    "(use --sidp-mode sidp for dense models)"
                )
            if mode == SidpMode.SIDP and is_moe is True:
                problems.append(
                    f"--sidp-mode sidp shares dense FFNs, but {server_args.model_path} is an MoE model "
                    "(use --sidp-mode zerodp)"
                )
        if mode == SidpMode.ZERODP:
            pp = int(getattr(server_args, "pp_size", 1) or 1)
            if pp > 1:
                problems.append(f"--sidp-mode zerodp needs --pp-size 1 (each replica holds all its layers), got {pp}")
            if getattr(server_args, "enable_dp_attention", False):
                problems.append(
                    "--sidp-mode zerodp pairs independent DP replicas; it does not work with --enable-dp-attention"
                )
            if int(getattr(server_args, "dwdp_size", 1) or 1) > 1:
                problems.append("--sidp-mode zerodp and --dwdp-size both move expert weights; use one of them")
            if getattr(server_args, "offload_mode", "cpu") == "sharded_gpu" or float(getattr(server_args, "cpu_offload_gb", 0) or 0) > 0:
                problems.append("--sidp-mode zerodp does not combine with SGLang's weight offloading (--offload-mode/--cpu-offload-gb)")
        if problems:
            raise SidpConfigError(problems)


def model_is_moe(model_path: str) -> bool | None:
    """Whether the Hugging Face config at `model_path` describes an MoE model.

    Reads only `<model_path>/config.json` (no hub access). Returns None when the
    path is not a local folder with a config.json (e.g. a hub id), so callers
    can leave the check to a later stage instead of guessing.
    """
    cfg_file = Path(model_path) / "config.json"
    if not cfg_file.is_file():
        return None
    cfg = json.loads(cfg_file.read_text())
    cfg = cfg.get("text_config", cfg)
    expert_keys = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
    if any(int(cfg.get(k) or 0) > 1 for k in expert_keys):
        return True
    return any("moe" in a.lower() for a in cfg.get("architectures", []))
