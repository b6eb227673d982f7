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
        name: the `--sidp-mode` value; also the prefix of its flags (`--sidp-<name>-<field>`) and
            the attribute of `SidpConfig` that holds its settings.
        summary: one line for `--help`.
        settings: pydantic model of its flags (field descriptions become the `--help` texts).
        check: `(config, sglang_args) -> problems`: every reason it cannot run with these SGLang
            flags, one line each. CPU only (may read the model's config.json and NVML); runs on
            SGLang's raw argparse namespace, before `ServerArgs` exists or a GPU is touched.
        sglang_defaults: `(sglang_argv) -> sglang_argv` with the SGLang flags the feature changes
            unless the user set them.
        describe: `(config, server_args) -> str`, appended to the launcher's start-up line.
    """

    name: str
    summary: str
    settings: type[BaseModel]
    check: Callable[[Any, argparse.Namespace], list[str]]
    sglang_defaults: Callable[[list[str]], list[str]] = lambda argv: list(argv)
    describe: Callable[[Any, Any], str] = lambda cfg, server_args: ""


def flag_given(argv: list[str], *flags: str) -> bool:
    """Whether any of `flags` appears in `argv` (as `--flag value` or `--flag=value`)."""
    return any(a == f or a.startswith(f + "=") for a in argv for f in flags)
