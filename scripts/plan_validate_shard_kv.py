"""The planner's KV tokens for every shard a server ran, next to what SGLang logged (`max_total_num_tokens`).

    python scripts/plan_validate_shard_kv.py LOG_OR_TGZ [...] [--gpu H200]

Each log is an SGLang server's (plain, `.gz`, or inside a `.tgz` of several): a `plan calibrate` shard server or any
other TP1 server on one GPU. From its `server_args` line (model path, `--json-model-override-args`, TP size) the
planner's memory model predicts what it allocates: the model's config with the overrides, its weights at TP1, SGLang's
default `--mem-fraction-static` for the GPU kind and the free memory before load the planner assumes
(`steps.GPUS`), as `python -m sgl_sidp.plan` does for each configuration. Servers of TP > 1 or with a
`--mem-fraction-static` of their own are listed and left out. Prints a markdown table with each error.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import tarfile
from pathlib import Path

from sgl_sidp.calibration.memory import GIB, ModelShapes, default_mem_fraction_static, dtype_bytes, kv_tokens
from sgl_sidp.plan.steps import GPUS


def logs(paths: list[Path]):
    """(name, text) of every log in `paths` (plain, .gz, or the members of a .tgz)."""
    for p in paths:
        if p.name.endswith((".tgz", ".tar.gz")):
            with tarfile.open(p) as tar:
                for m in tar.getmembers():
                    if m.isfile():
                        yield f"{p.name}:{m.name}", tar.extractfile(m).read().decode(errors="replace")
        elif p.suffix == ".gz":
            yield p.name, gzip.decompress(p.read_bytes()).decode(errors="replace")
        else:
            yield p.name, p.read_text(errors="replace")


def row(name: str, text: str, gpu: str, models_dir: Path | None) -> str | None:
    """One table row for the server whose log is `text` (None: not a log of a server that allocated a KV pool; "": a
    server of more than one GPU)."""
    logged = re.search(r"max_total_num_tokens=(\d+)", text)
    args = re.search(r"server_args=ServerArgs\((.*?)\)\n", text)
    if not logged or not args:
        return None
    a = args.group(1)
    path = re.search(r"model_path='([^']*)'", a).group(1)
    over = re.search(r"json_model_override_args='([^']*)'", a)
    tp = int(re.search(r"tp_size=(\d+)", a).group(1))
    dp = int(re.search(r"dp_size=(\d+)", a).group(1))
    frac_logged = float(re.search(r"mem_fraction_static=([\d.]+)", a).group(1))
    folder = (models_dir / Path(path).name) if models_dir else Path(path)
    config = folder / "config.json"
    if not config.is_file():
        return f"| {name} | {path} | | | | config.json not found (--models-dir) |"
    hf = {**json.loads(config.read_text()), **json.loads(over.group(1) if over else "{}")}
    if tp != 1 or dp != 1:
        return ""  # not one GPU: `plan_validate_multi_gpu.py` compares those
    kind = GPUS[gpu]
    frac = default_mem_fraction_static(kind["mib"], 1)
    shapes = ModelShapes.of(hf)
    elt = dtype_bytes(hf)
    pred = kv_tokens(kind["free_before_load_gib"] * GIB, frac, shapes.weight_bytes(elt=elt), shapes.kv_bytes_per_token(1, elt))
    got = int(logged.group(1))
    note = "" if abs(frac - frac_logged) < 1e-9 else f"mem fraction {frac} predicted, {frac_logged} logged"
    what = f"{Path(path).name} " + (", ".join(f"{k}={v}" for k, v in json.loads(over.group(1)).items()
                                               if k in ("num_attention_heads", "num_key_value_heads",
                                                        "intermediate_size", "moe_intermediate_size", "num_hidden_layers"))
                                    if over else "whole")
    return f"| {name.rsplit(':', 1)[-1]} | {what} | {pred:,} | {got:,} | {pred / got - 1:+.2%} | {note} |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("logs", type=Path, nargs="+", help="server logs (.log, .gz) or .tgz files of them")
    ap.add_argument("--gpu", default="H200", help=f"GPU kind the servers ran on: {', '.join(GPUS)} (default: H200)")
    ap.add_argument("--models-dir", type=Path, default=None,
                    help="where the models' config.json folders are (default: the logged model path as it is)")
    a = ap.parse_args()
    print("| log | model, shard sizes | predicted KV tokens | logged | error | note |\n|---|---|---:|---:|---:|---|")
    left_out = 0
    for name, text in logs(a.logs):
        r = row(name, text, a.gpu, a.models_dir)
        left_out += r == ""
        if r:
            print(r)
    if left_out:
        print(f"\n{left_out} server(s) of more than one GPU left out")


if __name__ == "__main__":
    main()
