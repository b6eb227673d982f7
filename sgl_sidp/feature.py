"""The feature contract: what a technique (ZeroDP, SiDP, Shift) declares, in its own folder.

A feature is registered by one line in `sgl_sidp.features.FEATURES`; nothing outside its folder
branches on its mode. Its hooks are entries of the one table `sgl_sidp.hooks.HOOKS` (tagged with
the feature's name), whose bodies are methods of the feature's per-process runtime object.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Callable

from pydantic import BaseModel


@dataclasses.dataclass(frozen=True)
class Feature:
    """One technique of the overlay.

    Attributes:
        name: the `--overlay-mode` value; also the prefix of its flags (`--<name>-<field>`) and
            the attribute of `SidpConfig` that holds its settings.
        summary: one line for `--help`.
        architectures: the allowlist: model architecture -> the SGLang classes the feature's hooks act through for it
            (`architecture_problems`).
        refused: architectures refused with a concrete reason: architecture -> (the SGLang classes of its layers that
            no hook of the feature acts on, dotted paths; why, naming those classes, with "{hooked}" for the classes
            the hooks do act on). The refusal line says why (`architecture_problems`); `tests/test_families.py` checks
            each class against the pinned SGLang.
        settings: pydantic model of its flags (field descriptions become the `--help` texts).
        check: `(config, sglang_args) -> problems`: every reason it cannot run with these SGLang
            flags, one line each. CPU only (may read the model's config.json and NVML); runs on
            SGLang's raw argparse namespace, before `ServerArgs` exists or a GPU is touched.
        sglang_defaults: `(sglang_argv) -> sglang_argv` with the SGLang flags the feature changes
            unless the user set them.
        describe: `(config, server_args) -> str`, appended to the launcher's start-up line.
        ignored: `(settings) -> {field: the sub-mode that reads it}` for the fields these settings leave unused
            (e.g. SiDP's B_th outside `auto`); `SidpConfig.validate_against` refuses them when given.
        resolve: `(config, server_args) -> (config, problems)`, once SGLang resolved its settings (`ServerArgs`,
            still before any model or KV memory is taken): checks that need SGLang's resolved values, and the
            feature's defaults that depend on them (the returned config is what SGLang's processes get).
        planner: "module:attribute" of the feature's planner part, a `sgl_sidp.plan.technique.Technique` (its
            configuration names and options, launch flags, shards, memory and step model), resolved only when the
            planner runs (`technique.techniques`); "" for a feature the planner does not model.
        declines: `(config, sglang_args) -> why`: why the feature, as configured, is predicted to gain nothing over
            vanilla SGLang of the same layout on these flags (e.g. ZeroDP whose policy offloads no layer: every sink
            a DP replica with less KV), so the launcher starts vanilla SGLang with that line instead; "" to run.
            Called after `check` passed, on SGLang's raw flags, before any GPU memory is taken.
    """

    name: str
    summary: str
    architectures: dict[str, tuple[str, ...]]
    settings: type[BaseModel]
    check: Callable[[Any, argparse.Namespace], list[str]]
    sglang_defaults: Callable[[list[str]], list[str]] = lambda argv: list(argv)
    describe: Callable[[Any, Any], str] = lambda cfg, server_args: ""
    ignored: Callable[[Any], dict[str, str]] = lambda settings: {}
    resolve: Callable[[Any, Any], tuple[Any, list[str]]] = lambda cfg, server_args: (cfg, [])
    refused: dict[str, tuple[tuple[str, ...], str]] = dataclasses.field(default_factory=dict)
    planner: str = ""
    declines: Callable[[Any, argparse.Namespace], str] = lambda cfg, raw: ""


def replica_problems(mode: str, raw: argparse.Namespace, *, pp_why: str, dp_attention_why: str) -> list[str]:
    """What every feature that shares weights across independent DP replicas refuses, one line each: pipeline
    parallelism (`pp_why`: why each replica needs all its layers), DP attention (`dp_attention_why`: what the
    feature pairs instead) and SGLang's own weight offloading."""
    problems = []
    pp = int(getattr(raw, "pp_size", 1) or 1)
    if pp > 1:
        problems.append(f"--overlay-mode {mode} needs --pp-size 1 ({pp_why}), got {pp}")
    if getattr(raw, "enable_dp_attention", False):
        problems.append(f"--overlay-mode {mode} {dp_attention_why}; it does not work with --enable-dp-attention")
    if getattr(raw, "offload_mode", "cpu") == "sharded_gpu" or float(getattr(raw, "cpu_offload_gb", 0) or 0) > 0:
        problems.append(f"--overlay-mode {mode} does not combine with SGLang's weight offloading (--offload-mode/--cpu-offload-gb)")
    return problems


def architecture_problems(mode: str, hf: dict | None, architectures: dict[str, tuple[str, ...]], covers: str,
                          refused: dict[str, tuple[tuple[str, ...], str]] | None = None) -> list[str]:
    """The architecture check every feature makes: the model's (from its config.json, `hf`; None when unreadable)
    must be a key of `architectures`, the feature's allowlist: architecture -> the SGLang classes its hooks act
    through for it (`tests/test_families.py` derives each entry from the pinned SGLang's model classes). One line
    naming what is missing, else none. `covers` says what those classes give the feature; `refused`
    (`Feature.refused`) gives the concrete reason instead for architectures known to be out of reach."""
    archs = (hf or {}).get("architectures") or []
    if hf is None or any(a in architectures for a in archs):
        return []
    hooked = sorted({c.rsplit(".", 1)[-1] for classes in architectures.values() for c in classes})
    known = next((refused[a][1] for a in archs if a in (refused or {})), None)
    why = (known.format(hooked=", ".join(hooked)) if known else
           f"its SGLang layers are not among the classes the {mode} hooks act on ({', '.join(hooked)}: {covers})")
    return [f"--overlay-mode {mode} supports {', '.join(sorted(architectures))}, not {', '.join(archs) or 'an unnamed '
            f'architecture'}: {why}"]


def dense_model_problems(mode: str, model_path: str, architectures: dict[str, tuple[str, ...]], covers: str,
                         moe_hint: str = "", refused: dict[str, tuple[tuple[str, ...], str]] | None = None
                         ) -> tuple[list[str], dict | None]:
    """What a dense-model feature refuses in `model_path`'s config.json, one line each: an MoE model (`moe_hint`
    appended, e.g. where to go instead), or an architecture outside `architectures` (`architecture_problems`, with
    the feature's `refused` reasons). Returns (problems, the HF config or None when it cannot be read)."""
    from sgl_sidp.model_info import model_is_moe, read_hf_config

    hf = read_hf_config(model_path)
    if model_is_moe(model_path):
        return [f"--overlay-mode {mode} is for dense models; {model_path} is MoE{moe_hint}"], hf
    return architecture_problems(mode, hf, architectures, covers, refused), hf


def flag_given(argv: list[str], *flags: str) -> bool:
    """Whether any of `flags` appears in `argv` (as `--flag value` or `--flag=value`)."""
    return any(a == f or a.startswith(f + "=") for a in argv for f in flags)
