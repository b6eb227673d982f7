#!/usr/bin/env python3
"""Fetch the public traces listed in ``bench_traces/manifest.json`` and verify their SHA-256.

On a networked host it downloads each trace from its ``url``; with ``--from DIR`` it copies the files from a local
folder instead (e.g. a shared traces folder). A file whose checksum does not match the manifest is not kept. A file
already at the destination with the right checksum is left alone. Standard library only.

    python scripts/fetch_traces.py                       # download all into bench_traces/data
    python scripts/fetch_traces.py --from ../shared/traces --only azure_code_2023

Exit status: 0 when every trace asked for is in place (or, with ``--from``, simply absent from DIR), 1 when a
download failed or a checksum did not match.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MANIFEST = REPO / "bench_traces" / "manifest.json"


def sha256_of(path: Path) -> str:
    """Hex SHA-256 of a file."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_one(entry: dict, dest_dir: Path, src_dir: Path | None, force: bool, timeout_s: float) -> bool:
    """Put one manifest entry's file into ``dest_dir``. Returns False on a failed download or checksum mismatch."""
    name, expected = entry["name"], entry.get("sha256")
    dest = dest_dir / entry["file"]
    if dest.exists() and not force and expected and sha256_of(dest) == expected:
        print(f"{name}: ok, already at {dest}")
        return True
    if src_dir is not None and not (src_dir / entry["file"]).is_file():
        print(f"{name}: skipped, {entry['file']} is not in {src_dir}")
        return True
    dest_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=dest_dir, prefix=f".{entry['file']}.", delete=False) as tmp:
        tmp_path = Path(tmp.name)
        try:
            if src_dir is not None:
                with (src_dir / entry["file"]).open("rb") as f:
                    shutil.copyfileobj(f, tmp)
            else:
                print(f"{name}: downloading {entry['url']}")
                with urllib.request.urlopen(entry["url"], timeout=timeout_s) as r:
                    shutil.copyfileobj(r, tmp)
        except OSError as e:
            tmp_path.unlink(missing_ok=True)
            print(f"{name}: FAILED to fetch: {e}", file=sys.stderr)
            return False
    got = sha256_of(tmp_path)
    if expected and got != expected:
        tmp_path.unlink()
        print(f"{name}: FAILED checksum: expected {expected}, got {got}", file=sys.stderr)
        return False
    tmp_path.replace(dest)
    note = "verified" if expected else f"no published checksum; sha256 {got}"
    print(f"{name}: {dest} ({note})")
    return True


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit status."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--from", dest="src", type=Path, default=None, help="copy from this folder instead of downloading")
    p.add_argument("--dest", type=Path, default=REPO / "bench_traces" / "data",
                   help="folder to put the traces in (default: bench_traces/data)")
    p.add_argument("--only", nargs="+", default=None, metavar="NAME", help="manifest names to fetch (default: all)")
    p.add_argument("--manifest", type=Path, default=MANIFEST,
                   help="the manifest: each trace's name, file, url and sha256 "
                        "(default: bench_traces/manifest.json)")
    p.add_argument("--force", action="store_true", help="fetch again even if a verified copy is in place")
    p.add_argument("--timeout-s", type=float, default=120.0,
                   help="per-download network timeout in seconds (default: %(default)s)")
    args = p.parse_args(argv)

    entries = json.loads(args.manifest.read_text())["traces"]
    if args.only:
        unknown = set(args.only) - {e["name"] for e in entries}
        if unknown:
            p.error(f"not in the manifest: {', '.join(sorted(unknown))}")
        entries = [e for e in entries if e["name"] in args.only]
    results = [fetch_one(e, args.dest, args.src, args.force, args.timeout_s) for e in entries]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
