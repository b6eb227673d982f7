"""One validated settings object for everything the overlay adds to SGLang.

`SidpConfig` is parsed from the `--sidp-*` flags next to SGLang's own `ServerArgs` flags
(`add_cli_args` / `from_cli_args`), checked against SGLang's flags (`validate_against`), and handed
to every SGLang child process through one environment variable (`to_env` / `from_env`), because
SGLang's scheduler processes are spawned and only inherit `os.environ`. The SGLang plugin
(`sgl_sidp.plugin`) reads it back in each process.

The core knows no feature: each one (`sgl_sidp.features.FEATURES`) brings its settings model,
which becomes the `SidpConfig` field of its name and the flags `--sidp-<name>-<field>`, and its
own checks. Every bad combination is reported as one line per problem, all at once, by
`SidpConfigError`, before SGLang allocates any GPU memory.
"""

from __future__ import annotations

import argparse
import enum
import json
import os
from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from sgl_sidp.features import FEATURES

#: Environment variable that carries the JSON-encoded `SidpConfig` to child processes.
ENV_VAR = "SIDP_CONFIG"


class SidpMode(str, enum.Enum):
    """Which weight-sharing technique the overlay runs (`--sidp-mode`)."""

    OFF = "off"  # plain SGLang (the batch-signal observer may still be on)
    ZERODP = "zerodp"  # MoE experts pulled from a source DP replica (ZeroDP)
    SIDP = "sidp"  # dense FFNs owned per DP rank, WaS/CaS (SiDP)
    SHIFT = "shift"  # Ulysses SP <-> TP switching on one KV cache (Shift Parallelism)
    AUTO = "auto"  # the launcher asks the planner (sgl_sidp.plan) and starts its winner, vanilla included


class SidpConfigError(ValueError):
    """Raised when the overlay's settings, alone or with SGLang's, are unusable.

    Attributes:
        problems: one human-readable line per problem found.
    """

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("invalid sgl-sidp settings:\n" + "\n".join(f"  - {p}" for p in self.problems))


def _flag(*loc: Any) -> str:
    """The flag of a settings field: ("zerodp", "layers") -> --sidp-zerodp-layers."""
    return "--sidp-" + "-".join(str(p) for p in loc).replace("_", "-")


class _CoreConfig(BaseModel):
    """The settings every mode shares; `SidpConfig` adds one field per feature."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_enum_values=False, allow_inf_nan=False)

    mode: SidpMode = Field(SidpMode.OFF, description="Weight-sharing technique: off, zerodp, sidp or shift; auto: "
                           "the launcher predicts every configuration of this model on these GPUs (python -m "
                           "sgl_sidp.plan, from one-GPU calibrations), prints the table and starts the winner, "
                           "vanilla SGLang included.")
    batch_signal: bool = Field(
        False,
        description="Record the scheduler's per-iteration batch signal (batch size, tokens computed, "
        "radix-cache prefix-hit tokens) even when --sidp-mode is off. Always on in the other modes.",
    )
    calibrate: bool = Field(
        False,
        description="Measure this server's forward times at start-up (after SGLang captured its CUDA graphs, "
        "before it serves; DP rank 0, a few seconds) and cache them on disk for the features' cost models, "
        "even with --sidp-mode off: a later start of any mode on the same GPU, model, TP size and SGLang then "
        "reads them instead of measuring. The log shows them next to a bundled table for the same model, if any.",
    )
    fold_gpus: bool = Field(
        False,
        description="Developer aid, for exactness checks on a one-GPU machine: every scheduler process runs on "
        "GPU (its SGLang gpu_id) mod (visible GPUs), so --dp-size 2 puts both replicas on GPU 0. They share its "
        "memory (give each a --max-total-tokens: SGLang sizes a replica's KV cache from the memory free when it "
        "profiles) and its compute, so a folded server says nothing about speed or capacity. Never for serving.",
    )
    plan_workload: str = Field(
        "offline:512:2048:256",
        description="[auto] the workload the planner ranks the configurations on: offline:S:IN:OUT (throughput), "
        "latency:IN:OUT or trace:FILE[:SCALE] (latency among the configurations that keep up).",
    )
    signal_log_interval: int = Field(
        40,
        ge=1,
        description="Scheduler iterations between two batch-signal log lines "
        "(SGLang's --decode-log-interval defaults to 40 too).",
    )

    # ------------------------------------------------------------------ derived
    @property
    def active(self) -> bool:
        """False means the plugin must be a strict no-op in every process."""
        return self.mode != SidpMode.OFF or self.batch_signal or self.calibrate or self.fold_gpus

    @property
    def signal_enabled(self) -> bool:
        """True when the scheduler observer must run (explicitly asked, or needed by a mode)."""
        return self.active

    # ------------------------------------------------------------------ CLI
    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
        """Add the `--sidp-*` flags to `parser` in their own argument group.

        Flag defaults are None so that `from_cli_args` can tell "not given" from "given the
        default"; the models' defaults apply for anything not given.
        """
        fields = _CoreConfig.model_fields
        group = parser.add_argument_group(
            "sgl-sidp overlay", "Weights shared across the GPUs of a node (ZeroDP, SiDP, Shift Parallelism)."
        )
        group.add_argument("--sidp-mode", choices=[m.value for m in SidpMode], default=None,
                           help=f"{fields['mode'].description} Default: off.")
        group.add_argument("--sidp-batch-signal", action="store_true", default=None,
                           help=fields["batch_signal"].description)
        group.add_argument("--sidp-calibrate", action="store_true", default=None, help=fields["calibrate"].description)
        group.add_argument("--sidp-fold-gpus", action="store_true", default=None, help=fields["fold_gpus"].description)
        group.add_argument("--sidp-plan-workload", default=None,
                           help=f"{fields['plan_workload'].description} Default: {fields['plan_workload'].default}.")
        group.add_argument("--sidp-signal-log-interval", type=int, default=None,
                           help=f"{fields['signal_log_interval'].description} Default: 40.")
        for feature in FEATURES.values():
            for name, field in feature.settings.model_fields.items():
                if field.annotation is bool:  # a switch, off unless given
                    group.add_argument(_flag(feature.name, name), action="store_true", default=None,
                                       help=f"[{feature.name}] {field.description}")
                    continue
                kind = field.annotation if field.annotation in (int, float) else str
                default = "" if field.default is None else f" Default: {field.default}."
                group.add_argument(_flag(feature.name, name), type=kind, default=None,
                                   help=f"[{feature.name}] {field.description}{default}")
        return group

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "SidpConfig":
        """Build the config from a namespace parsed with `add_cli_args`' flags.

        Raises:
            SidpConfigError: a flag value is out of range (one line per problem).
        """
        values: dict[str, Any] = {
            name: getattr(args, f"sidp_{name}")
            for name in _CoreConfig.model_fields
            if getattr(args, f"sidp_{name}", None) is not None
        }
        for feature in FEATURES.values():
            sub = {
                name: getattr(args, f"sidp_{feature.name}_{name}")
                for name in feature.settings.model_fields
                if getattr(args, f"sidp_{feature.name}_{name}", None) is not None
            }
            if sub:
                values[feature.name] = sub
        return cls.from_mapping(values)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "SidpConfig":
        """Validate a plain mapping (CLI values, decoded JSON) into a config.

        Raises:
            SidpConfigError: unknown keys or bad values, one line per problem.
        """
        try:
            return SidpConfig.model_validate(dict(values))
        except ValidationError as e:
            raise SidpConfigError([f"{_flag(*err['loc'])}: {err['msg'].removeprefix('Value error, ')}"
                                   for err in e.errors()]) from None

    # ------------------------------------------------------------------ env round trip
    def to_env(self, environ: dict | None = None) -> dict:
        """Store this config in `environ` (default `os.environ`) for child processes; returns it.

        Raises:
            SidpConfigError: the JSON would not read back as these settings in a child process (checked here, so
                such a value stops the launcher instead of a child's plugin).
        """
        environ = os.environ if environ is None else environ
        text = self.model_dump_json()
        mine, back = self.model_dump(), type(self).from_env({ENV_VAR: text}).model_dump()
        if back != mine:
            changed = [k for k, v in mine.items() if back.get(k) != v]
            raise SidpConfigError([f"settings {changed} would not reach SGLang's processes intact ({text})"])
        environ[ENV_VAR] = text
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
            return SidpConfig()
        try:
            values = json.loads(raw)
        except json.JSONDecodeError as e:
            raise SidpConfigError([f"${ENV_VAR} is not JSON: {e}"]) from None
        return cls.from_mapping(values)

    # ------------------------------------------------------------------ cross-checks
    @property
    def feature(self):
        """The `Feature` of this mode; None when off or not implemented."""
        return FEATURES.get(self.mode.value)

    def validate_against(self, server_args: Any) -> None:
        """Check this config against SGLang's flags, and refuse flags it would leave unused (`unused_flags`); CPU only
        (reads at most a config.json and NVML).

        Args:
            server_args: SGLang's flags: its argparse namespace (the launcher checks before
                `ServerArgs` exists) or a `ServerArgs`.

        Raises:
            SidpConfigError: every problem found, one line each.
        """
        problems = self.unused_flags()
        if self.mode != SidpMode.OFF and self.feature is None:
            problems.append(f"--sidp-mode {self.mode.value} is not implemented in this version of sgl-sidp yet")
        elif self.feature is not None:
            problems += self.feature.check(self, server_args)
        if problems:
            raise SidpConfigError(problems)

    def unused_flags(self) -> list[str]:
        """One line per flag given on the command line that these settings would leave unused: a flag of another
        mode, one of a sub-mode this one is not (`Feature.ignored`), or the signal's interval with the overlay off.
        Only flags actually given count (pydantic's `model_fields_set`), so defaults never trip it."""
        problems = []
        if "plan_workload" in self.model_fields_set and self.mode != SidpMode.AUTO:
            problems.append("--sidp-plan-workload is unused: it applies with --sidp-mode auto")
        if "signal_log_interval" in self.model_fields_set and not self.active:
            problems.append("--sidp-signal-log-interval is unused with the overlay off: add --sidp-batch-signal or a "
                            "--sidp-mode")
        for name, feature in FEATURES.items():
            given = getattr(self, name).model_fields_set
            if name != self.mode.value:
                problems += [f"{_flag(name, f)} is a flag of --sidp-mode {name}, but the mode is {self.mode.value}"
                             for f in sorted(given)]
                continue
            ignored = feature.ignored(getattr(self, name))
            problems += [f"{_flag(name, f)} is unused here: it applies {ignored[f]}" for f in sorted(given & ignored.keys())]
        return problems


#: The overlay's settings (immutable): the core fields above plus one sub-model per feature
#: (`cfg.zerodp.layers` is `--sidp-zerodp-layers`), built from `sgl_sidp.features.FEATURES`.
SidpConfig = create_model(
    "SidpConfig",
    __base__=_CoreConfig,
    __module__=__name__,
    **{f.name: (f.settings, Field(default_factory=f.settings, description=f.summary)) for f in FEATURES.values()},
)
