"""SGLang's flags that change what every configuration of a plan does alike, so the planner must see them: the prefill
chunk and budget, the KV pool's memory fraction and the largest decode batch run in a CUDA graph.

A user who starts `--overlay-mode auto` (or `python -m sgl_sidp.plan`) with `--chunked-prefill-size 4096` runs
4,096-token chunks whatever configuration wins; planned at SGLang's default of 8,192 the winner could be another one.
`ServerFlags` carries the flags the user gave (None: SGLang's default, which the planner computes per configuration
as SGLang would: `calibration.memory.default_mem_fraction_static`, `default_decode_graph_max_bs`), read off a command
line (`from_words`: the launcher's argv, `bench.compare`'s recorded server command) or SGLang's parsed flags
(`from_namespace`).

Source: SGLang 0.5.17 `ServerArgs` (`--chunked-prefill-size`, `--max-prefill-tokens`, `--mem-fraction-static`,
`--cuda-graph-max-bs-decode` and its deprecated spelling `--cuda-graph-max-bs`, `--disable-cuda-graph`,
`--disable-decode-cuda-graph`, `--disable-prefill-cuda-graph`, `--cuda-graph-backend-decode/-prefill disabled`),
`ServerArgs._handle_gpu_memory_settings` and `reserve_for_graph_mb` for the defaults. Other graph backends
(`full`, `tc_piecewise`) are planned as SGLang's default ones.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

#: flag -> (field, type) of the flags that take a value
VALUED = {"--chunked-prefill-size": ("chunked_prefill_size", int), "--max-prefill-tokens": ("max_prefill_tokens", int),
          "--mem-fraction-static": ("mem_fraction_static", float),
          "--cuda-graph-max-bs-decode": ("decode_graph_max_bs", int), "--cuda-graph-max-bs": ("decode_graph_max_bs", int),
          "--cuda-graph-backend-decode": ("decode_backend", str), "--cuda-graph-backend-prefill": ("prefill_backend", str)}
#: switch -> the graphs it turns off ("decode", "prefill")
SWITCHES = {"--disable-cuda-graph": ("decode", "prefill"), "--disable-decode-cuda-graph": ("decode",),
            "--disable-prefill-cuda-graph": ("prefill",)}


class ServerFlagsError(ValueError):
    """A flag's value the planner cannot use (not a number, out of range, or chunked prefill turned off)."""


@dataclasses.dataclass(frozen=True)
class ServerFlags:
    """The SGLang flags a plan's servers share (None: not given, SGLang's default for each configuration).

    Attributes:
        chunked_prefill_size: `--chunked-prefill-size`, tokens a prefill forward takes at most (> 0; SGLang's -1,
            no chunking, is refused: the simulation chunks). Under DP attention SGLang divides it by the DP size.
        max_prefill_tokens: `--max-prefill-tokens`, the new tokens one prefill batch admits at most (SGLang: 16,384).
        mem_fraction_static: `--mem-fraction-static`, the share of a GPU's memory for weights and the KV pool (0-1).
        decode_graph_max_bs: `--cuda-graph-max-bs-decode` (or `--cuda-graph-max-bs`), the largest decode batch run
            in a CUDA graph, larger ones eagerly (SGLang still sizes DP attention's padding by it with graphs off).
        decode_graphs, prefill_graphs: False where the flags turn those graphs off (`--disable-cuda-graph`: both;
            `--disable-decode-cuda-graph`, `--disable-prefill-cuda-graph`, `--cuda-graph-backend-* disabled`): every
            decode step eager; no prefill graphs' memory reserve.
    """

    chunked_prefill_size: int | None = None
    max_prefill_tokens: int | None = None
    mem_fraction_static: float | None = None
    decode_graph_max_bs: int | None = None
    decode_graphs: bool = True
    prefill_graphs: bool = True

    def __post_init__(self):
        problems = self.problems()
        if problems:
            raise ServerFlagsError("; ".join(problems))

    def problems(self) -> list[str]:
        """Every value the planner cannot use, one line each."""
        out = []
        if self.chunked_prefill_size is not None and self.chunked_prefill_size <= 0:
            out.append(f"--chunked-prefill-size {self.chunked_prefill_size}: the planner simulates chunked prefill "
                       "only (a chunk of at least 1 token)")
        if self.max_prefill_tokens is not None and self.max_prefill_tokens <= 0:
            out.append(f"--max-prefill-tokens {self.max_prefill_tokens}: at least 1")
        if self.mem_fraction_static is not None and not 0 < self.mem_fraction_static < 1:
            out.append(f"--mem-fraction-static {self.mem_fraction_static:g}: between 0 and 1")
        if self.decode_graph_max_bs is not None and self.decode_graph_max_bs < 0:
            out.append(f"--cuda-graph-max-bs-decode {self.decode_graph_max_bs}: at least 0")
        return out

    @classmethod
    def from_words(cls, words: Sequence[str]) -> "ServerFlags":
        """The flags in a command line's words ("--flag value" or "--flag=value"; others ignored; the last of a
        repeated flag wins, as argparse does).

        Raises:
            ServerFlagsError: a value that is not a number, or one `problems` names.
        """
        found: dict = {}
        words, off = list(words), set()
        for i, word in enumerate(words):
            flag, eq, value = word.partition("=")
            if flag in SWITCHES:
                off.update(SWITCHES[flag])
            elif flag in VALUED:
                field, kind = VALUED[flag]
                if not eq:
                    value = words[i + 1] if i + 1 < len(words) else ""
                try:
                    found[field] = kind(value)
                except ValueError:
                    raise ServerFlagsError(f"{flag} {value!r}: expected a number") from None
        for stage in ("decode", "prefill"):
            if found.pop(f"{stage}_backend", None) == "disabled":
                off.add(stage)
        return cls(**found, decode_graphs="decode" not in off, prefill_graphs="prefill" not in off)

    @classmethod
    def from_namespace(cls, ns) -> "ServerFlags":
        """The flags of SGLang's parsed arguments (`argparse.Namespace` of `ServerArgs.add_cli_args`: a value the
        user left unset, None, stays unset; or a resolved `ServerArgs`: SGLang's resolved values, this server's own);
        `--max-prefill-tokens` at SGLang's default (16,384) counts as unset."""
        def off(stage: str) -> bool:
            return bool(getattr(ns, "disable_cuda_graph", False) or getattr(ns, f"disable_{stage}_cuda_graph", False)
                        or getattr(ns, f"cuda_graph_backend_{stage}", None) == "disabled")

        budget = getattr(ns, "max_prefill_tokens", None)
        return cls(chunked_prefill_size=getattr(ns, "chunked_prefill_size", None),
                   max_prefill_tokens=None if budget == DEFAULT_MAX_PREFILL_TOKENS else budget,
                   mem_fraction_static=getattr(ns, "mem_fraction_static", None),
                   decode_graph_max_bs=getattr(ns, "cuda_graph_max_bs_decode", None),
                   decode_graphs=not off("decode"), prefill_graphs=not off("prefill"))

    def words(self) -> list[str]:
        """The flags as SGLang's command-line words (those given only), for a launch command."""
        out = []
        for flag, value in (("--chunked-prefill-size", self.chunked_prefill_size),
                            ("--max-prefill-tokens", self.max_prefill_tokens),
                            ("--mem-fraction-static", self.mem_fraction_static),
                            ("--cuda-graph-max-bs-decode", self.decode_graph_max_bs)):
            if value is not None:
                out += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
        if not (self.decode_graphs or self.prefill_graphs):
            out.append("--disable-cuda-graph")
        elif not self.decode_graphs or not self.prefill_graphs:
            out.append("--disable-decode-cuda-graph" if not self.decode_graphs else "--disable-prefill-cuda-graph")
        return out

    def decode_graph_size(self, default: int) -> int:
        """The largest decode batch SGLang sizes its decode graphs' memory by, graphs on or off: the given one, else
        `default` (the server's without the flag)."""
        return default if self.decode_graph_max_bs is None else self.decode_graph_max_bs

    def decode_graph_limit(self, default: int) -> int:
        """The largest decode batch run in a CUDA graph (0: none; `decode_graph_size` otherwise)."""
        return self.decode_graph_size(default) if self.decode_graphs else 0

    def describe(self) -> str:
        """The flags given, as one phrase ("" for none), for a plan's title."""
        return " ".join(self.words())


def only_server_flags(words: Sequence[str]) -> bool:
    """Whether `words` hold nothing but flags `ServerFlags` models, each with its value ("--flag value" or
    "--flag=value"): a configuration started with such extra flags (`bench.compare --config-args`) is predicted."""
    words, i = list(words), 0
    while i < len(words):
        flag, eq, _ = words[i].partition("=")
        if flag in SWITCHES and not eq:
            i += 1
        elif flag in VALUED and (eq or i + 1 < len(words)):
            i += 1 if eq else 2
        else:
            return False
    return True


#: SGLang 0.5.17's `--max-prefill-tokens` default (`ServerArgs.max_prefill_tokens`)
DEFAULT_MAX_PREFILL_TOKENS = 16384

#: no flags given: SGLang's defaults throughout
DEFAULTS = ServerFlags()
