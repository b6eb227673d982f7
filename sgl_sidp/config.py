"""One validated settings object for everything the overlay adds to SGLang.

`SidpConfig` is parsed from our flags next to SGLang's own `ServerArgs` flags
(`add_cli_args` / `from_cli_args`), checked against SGLang's flags (`validate_against`), and handed
to every SGLang child process through one environment variable (`to_env` / `from_env`), because
SGLang's scheduler processes are spawned and only inherit `os.environ`. The SGLang plugin
(`sgl_sidp.plugin`) reads it back in each process.

The core knows no feature: each one (`sgl_sidp.features.FEATURES`) brings its settings model,
which becomes the `SidpConfig` field of its name and the flags `--<name>-<field>`, and its own
checks; the core's flags are `--overlay-<field>`. Every bad combination is reported as one line per
problem, all at once, by `SidpConfigError`, before SGLang allocates any GPU memory.
"""

from __future__ import annotations

import argparse
import enum
import json
import os
import typing
from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator

from sgl_sidp.features import FEATURES

#: Environment variable that carries the JSON-encoded `SidpConfig` to child processes.
ENV_VAR = "SIDP_CONFIG"


class SidpMode(str, enum.Enum):
    """Which weight-sharing technique the overlay runs (`--overlay-mode`)."""

    OFF = "off"  # plain SGLang (the batch-signal observer may still be on)
    ZERODP = "zerodp"  # MoE experts pulled from a source DP replica (ZeroDP)
    SIDP = "sidp"  # dense FFNs owned per DP rank, WaS/CaS (SiDP)
    SHIFT = "shift"  # Ulysses SP <-> TP switching on one KV cache (Shift Parallelism)
    AUTO = "auto"  # the launcher asks the planner (sgl_sidp.plan) and starts its winner, vanilla included


class SidpConfigError(ValueError):
    """Raised when the overlay's settings, alone or with SGLang's, are unusable. Its text is the one problem, or a
    heading and one line per problem.

    Attributes:
        problems: one human-readable line per problem found.
    """

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(self.problems[0] if len(self.problems) == 1 else f"invalid sgl-sidp settings:\n{lines}")


def _flag(*loc: Any) -> str:
    """The flag of a settings field: ("mode",) -> --overlay-mode, ("zerodp", "layers") -> --zerodp-layers."""
    return "--" + "-".join(str(p) for p in (("overlay", *loc) if len(loc) == 1 else loc)).replace("_", "-")


#: Our flags before each technique got its own prefix (old spelling -> new). The launcher refuses an old one with
#: one line naming the new (`renamed_flags`); results recorded before the change (benchmarks/results) use them.
RENAMED = {
    **{f"--sidp-{f}": f"--overlay-{f}" for f in ("mode", "batch-signal", "calibrate", "fold-gpus",
                                                "signal-log-interval", "plan-workload")},
    **{f"--sidp-zerodp-{f}": f"--zerodp-{f}" for f in ("tensors", "layers", "expected-batch", "calibration",
                                                       "source-timeout-s")},
    "--sidp-sidp-force": "--sidp-service",
    **{f"--sidp-sidp-{f}": f"--sidp-{f}" for f in ("b-th", "hysteresis", "cas-graphs", "slots", "fetch-order",
                                                   "owner-timeout-s")},
    **{f"--sidp-shift-{f}": f"--shift-{f}" for f in ("sp", "threshold")},
}


def renamed_flags(argv: list[str]) -> list[str]:
    """One line per old spelling of our flags in `argv` (`RENAMED`), e.g. "--sidp-sidp-force was renamed
    --sidp-service"."""
    return [f"{old} was renamed {RENAMED[old]}" for a in argv if (old := a.split("=", 1)[0]) in RENAMED]


def _choices(annotation: Any) -> list[str] | None:
    """The values of an enumerated settings field (an Enum or a Literal), for argparse's `choices`; None otherwise."""
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return [m.value for m in annotation]
    return list(typing.get_args(annotation)) if typing.get_origin(annotation) is typing.Literal else None


def _add_flag(group: argparse._ArgumentGroup, loc: tuple[str, ...], field: Any, tag: str = "") -> None:
    """Add the flag of one settings field (`_flag(*loc)`): a switch for a bool, `choices` for an enumeration, else
    the field's `metavar` (its `json_schema_extra`) or its name. The default is None, so "not given" stays apart from
    "given the default"; the help says the model's default."""
    help = tag + (field.description or "")
    if field.annotation is bool:  # a switch, off unless given
        group.add_argument(_flag(*loc), action="store_true", default=None, help=help)
        return
    if field.annotation == bool | None:  # on, off or the feature's own choice: --x / --no-x
        group.add_argument(_flag(*loc), action=argparse.BooleanOptionalAction, default=None, help=help)
        return
    default, choices = getattr(field.default, "value", field.default), _choices(field.annotation)
    kind = field.annotation if field.annotation in (int, float) else str
    metavar = None if choices else (field.json_schema_extra or {}).get("metavar", loc[-1].upper())
    group.add_argument(_flag(*loc), type=kind, choices=choices, default=None, metavar=metavar,
                       help=help + ("" if default is None else f" Default: {default}."))


class _CoreConfig(BaseModel):
    """The settings every mode shares; `SidpConfig` adds one field per feature."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_enum_values=False, allow_inf_nan=False)

    mode: SidpMode = Field(
        SidpMode.OFF,
        description="Weight-sharing technique: off (plain SGLang), zerodp, sidp or shift; auto: the launcher predicts "
        "every configuration of this model on these GPUs (python -m sgl_sidp.plan, from one-GPU calibrations), prints "
        "the table and starts the winner, vanilla SGLang included.",
    )
    batch_signal: bool = Field(
        False,
        description="Record the scheduler's per-iteration batch signal (batch size, tokens computed, "
        "radix-cache prefix-hit tokens) even when --overlay-mode is off. Always on in the other modes.",
    )
    calibrate: bool = Field(
        False,
        description="Measure this server's forward times at start-up (after SGLang captured its CUDA graphs, "
        "before it serves; DP rank 0, a few seconds) and cache them on disk for the features' cost models, "
        "even with --overlay-mode off: a later start of any mode on the same GPU, model, TP size and SGLang then "
        "reads them instead of measuring. The log shows them next to a bundled table for the same model, if any.",
    )
    fold_gpus: bool = Field(
        False,
        description="Developer aid, for exactness checks on a one-GPU machine: every scheduler process runs on "
        "GPU (its SGLang gpu_id) mod (visible GPUs), so --dp-size 2 puts both replicas on GPU 0. They share its "
        "memory (give each a --max-total-tokens: SGLang sizes a replica's KV cache from the memory free when it "
        "profiles) and its compute, so a folded server says nothing about speed or capacity. Never for serving.",
    )
    start_after: str | None = Field(
        None,
        json_schema_extra={"metavar": "FILE"},
        description="Developer aid for python -m sgl_sidp.plan calibrate on one GPU: each scheduler process does "
        "SGLang's start-up on the CPU (imports, tokenizer), then waits until FILE exists before it takes any GPU "
        "memory (ModelRunner.init_torch_distributed), so the next shard's server starts while the current one is "
        "timed; on getting there it makes FILE.reached. It stops with one line after 30 minutes without FILE. Never "
        "for serving.",
    )
    plan_workload: str = Field(
        "offline:512:2048:256",
        json_schema_extra={"metavar": "offline:S:IN:OUT|latency:IN:OUT|trace:FILE[:SCALE]"},
        description="the workload the planner ranks the configurations on, for auto's pick and for the line an "
        "explicit mode logs at start-up (its predicted ratio to the best vanilla configuration): offline:S:IN:OUT "
        "(throughput), latency:IN:OUT or trace:FILE[:SCALE] (latency among the configurations that keep up).",
    )
    plan_slo_ttft_ms: float | None = Field(
        None,
        gt=0,
        json_schema_extra={"metavar": "MS"},
        description="with --overlay-plan-slo-tpot-ms: the planner ranks the configurations by goodput on "
        "--overlay-plan-workload, the requests per second that meet both SLOs (TTFT and TPOT, ms), for auto's pick "
        "and an explicit mode's start-up line.",
    )
    plan_slo_tpot_ms: float | None = Field(
        None, gt=0, json_schema_extra={"metavar": "MS"}, description="see --overlay-plan-slo-ttft-ms."
    )
    signal_log_interval: int = Field(
        40,
        ge=1,
        description="Scheduler iterations between two batch-signal log lines "
        "(SGLang's --decode-log-interval defaults to 40 too).",
    )

    @field_validator("start_after")
    @classmethod
    def _start_after_folder(cls, v: str | None) -> str | None:
        """FILE's folder must exist (else the gate could never open)."""
        if v is not None and not os.path.isdir(os.path.dirname(os.path.abspath(v))):
            raise ValueError(f"the folder of {v} does not exist, so the file can never appear")
        return v

    # ------------------------------------------------------------------ derived
    @property
    def active(self) -> bool:
        """False means the plugin must be a strict no-op in every process."""
        return (self.mode != SidpMode.OFF or self.batch_signal or self.calibrate or self.fold_gpus
                or self.start_after is not None)

    @property
    def signal_enabled(self) -> bool:
        """True when the scheduler observer must run (explicitly asked, or needed by a mode)."""
        return self.active

    # ------------------------------------------------------------------ CLI
    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
        """Add our flags to `parser` in their own argument group: the core's `--overlay-<field>`, then each feature's
        `--<feature>-<field>`.

        Flag defaults are None so that `from_cli_args` can tell "not given" from "given the
        default"; the models' defaults apply for anything not given.
        """
        group = parser.add_argument_group(
            "sgl-sidp overlay (weights shared across the GPUs of a node)",
            "--overlay-mode picks the technique (ZeroDP, SiDP, Shift Parallelism); each technique's flags carry its "
            "name. Every SGLang flag below works too.",
        )
        for name, field in _CoreConfig.model_fields.items():
            _add_flag(group, (name,), field)
        for feature in FEATURES.values():
            for name, field in feature.settings.model_fields.items():
                _add_flag(group, (feature.name, name), field, tag=f"[{feature.name}] ")
        return group

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "SidpConfig":
        """Build the config from a namespace parsed with `add_cli_args`' flags.

        Raises:
            SidpConfigError: a flag value is out of range (one line per problem).
        """
        def given(*loc):  # the flag's value, None when not given (argparse's dest of `_flag(*loc)`)
            return getattr(args, _flag(*loc)[2:].replace("-", "_"), None)

        values: dict[str, Any] = {name: given(name) for name in _CoreConfig.model_fields if given(name) is not None}
        for feature in FEATURES.values():
            sub = {name: given(feature.name, name) for name in feature.settings.model_fields
                   if given(feature.name, name) is not None}
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

    @property
    def plan_slo(self) -> tuple[float, float] | None:
        """(TTFT ms, TPOT ms) the planner ranks by goodput with, or None (both flags are needed)."""
        if self.plan_slo_ttft_ms is None or self.plan_slo_tpot_ms is None:
            return None
        return self.plan_slo_ttft_ms, self.plan_slo_tpot_ms

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
            problems.append(f"--overlay-mode {self.mode.value} is not implemented in this version of sgl-sidp yet")
        elif self.feature is not None:
            problems += self.feature.check(self, server_args)
        if problems:
            raise SidpConfigError(problems)

    def unused_flags(self) -> list[str]:
        """One line per flag given on the command line that these settings would leave unused: a flag of another
        mode, one of a sub-mode this one is not (`Feature.ignored`), or the signal's interval with the overlay off.
        Only flags actually given count (pydantic's `model_fields_set`), so defaults never trip it."""
        problems = []
        for f in ("plan_workload", "plan_slo_ttft_ms", "plan_slo_tpot_ms"):
            if f in self.model_fields_set and self.mode == SidpMode.OFF:
                problems.append(f"{_flag(f)} is unused: it applies with an --overlay-mode")
        if (self.plan_slo_ttft_ms is None) != (self.plan_slo_tpot_ms is None):
            problems.append("--overlay-plan-slo-ttft-ms and --overlay-plan-slo-tpot-ms go together: give both or "
                            "neither")
        if "signal_log_interval" in self.model_fields_set and not self.active:
            problems.append("--overlay-signal-log-interval is unused with the overlay off: add --overlay-batch-signal "
                            "or an --overlay-mode")
        for name, feature in FEATURES.items():
            given = getattr(self, name).model_fields_set
            if name != self.mode.value:
                problems += [f"{_flag(name, f)} is a flag of --overlay-mode {name}, but the mode is {self.mode.value}"
                             for f in sorted(given)]
                continue
            ignored = feature.ignored(getattr(self, name))
            problems += [f"{_flag(name, f)} is unused here: it applies {ignored[f]}" for f in sorted(given & ignored.keys())]
        return problems


#: The overlay's settings (immutable): the core fields above plus one sub-model per feature
#: (`cfg.zerodp.layers` is `--zerodp-layers`), built from `sgl_sidp.features.FEATURES`.
SidpConfig = create_model(
    "SidpConfig",
    __base__=_CoreConfig,
    __module__=__name__,
    **{f.name: (f.settings, Field(default_factory=f.settings, description=f.summary)) for f in FEATURES.values()},
)
