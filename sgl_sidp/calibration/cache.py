"""Where a calibration comes from, and the disk cache that makes a second start free.

Resolution order (`resolve`), first hit wins:
1. a file the user names (`--zerodp-calibration`),
2. a bundled table for this model signature and GPU (`BUNDLED_DIR`, measured offline),
3. the disk cache entry for this exact `CalibrationKey` (written by an earlier start-up measurement),
4. none: the caller measures at start-up (`sgl_sidp.calibration.measure`) and `put`s the result.

The cache lives in `$SIDP_CALIBRATION_DIR` (default `~/.cache/sgl-sidp/calibration`), one JSON
file per key. A key names everything that changes the numbers: GPU name, model shapes (signature
and dtype), quantization, TP size, attention backend, SGLang version, and `FORMAT` (bumped when
what is measured changes). Any difference is a miss, never a stale hit; delete a file to re-measure.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Iterator

from sgl_sidp.calibration.table import Calibration

logger = logging.getLogger(__name__)

#: Version of what a start-up measurement contains; part of every cache key.
FORMAT = 2  # 2: decode times at two contexts per batch (decode_ms_long)

#: Calibration tables shipped with the package (offline measurements).
BUNDLED_DIR = Path(__file__).with_name("bundled")


def default_cache_dir() -> Path:
    """`$SIDP_CALIBRATION_DIR`, else `~/.cache/sgl-sidp/calibration`."""
    env = os.environ.get("SIDP_CALIBRATION_DIR")
    return Path(env) if env else Path.home() / ".cache" / "sgl-sidp" / "calibration"


@dataclasses.dataclass(frozen=True)
class CalibrationKey:
    """What a cached calibration is valid for.

    Attributes:
        gpu: `torch.cuda.get_device_name()`, e.g. "NVIDIA H200".
        model: `sgl_sidp.model_info.model_signature` (architecture, shapes, TP size).
        dtype: the model's compute dtype, e.g. "torch.bfloat16".
        quantization: SGLang's `--quantization` ("" for none).
        attention_backend: SGLang's resolved attention backend, e.g. "triton".
        sglang: SGLang version.
        format: `FORMAT`.
    """

    gpu: str
    model: str
    dtype: str
    quantization: str
    attention_backend: str
    sglang: str
    format: int = FORMAT

    def file_name(self) -> str:
        """`<readable slug>-<hash of every field>.json`."""
        digest = hashlib.sha256(json.dumps(dataclasses.asdict(self), sort_keys=True).encode()).hexdigest()[:16]
        slug = re.sub(r"[^A-Za-z0-9]+", "_", f"{self.gpu} {self.model}").strip("_")[:80]
        return f"{slug}-{digest}.json"


class CalibrationCache:
    """Start-up calibrations on disk, one file per `CalibrationKey` (written atomically)."""

    def __init__(self, directory: Path | None = None):
        self.dir = Path(directory) if directory is not None else default_cache_dir()

    def path(self, key: CalibrationKey) -> Path:
        return self.dir / key.file_name()

    def get(self, key: CalibrationKey) -> Calibration | None:
        """The cached calibration for exactly `key`, or None (missing, unreadable or another key)."""
        p = self.path(key)
        try:
            d = json.loads(p.read_text())
            if d.get("key") != dataclasses.asdict(key):
                return None
            return Calibration.from_json(d["calibration"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):  # unreadable or not of our shape
            return None

    def put(self, key: CalibrationKey, cal: Calibration) -> Path:
        """Store `cal` under `key` (replacing any entry); returns the file written."""
        self.dir.mkdir(parents=True, exist_ok=True)
        p = self.path(key)
        tmp = p.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"key": dataclasses.asdict(key), "calibration": cal.to_json()}, indent=1))
        tmp.replace(p)
        return p

    def get_extra(self, key: CalibrationKey, kind: str) -> dict | None:
        """A feature's own measurement cached under `key` and `kind` (e.g. "shift-sp2"), or None."""
        p = self.dir / f"{kind}-{key.file_name()}"
        try:
            d = json.loads(p.read_text())
            return d["data"] if d.get("key") == dataclasses.asdict(key) else None
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def put_extra(self, key: CalibrationKey, kind: str, data: dict) -> Path:
        """Store a feature's own measurement (JSON-able `data`) under `key` and `kind`; returns the file written."""
        self.dir.mkdir(parents=True, exist_ok=True)
        p = self.dir / f"{kind}-{key.file_name()}"
        tmp = p.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"key": dataclasses.asdict(key), "data": data}, indent=1))
        tmp.replace(p)
        return p

    def wait(self, key: CalibrationKey, timeout_s: float, alive=lambda: True, poll_s: float = 0.5) -> Calibration | None:
        """Wait up to `timeout_s` for another process to `put` `key`; None on timeout or once `alive()` is False."""
        deadline = time.monotonic() + timeout_s
        while True:
            cal = self.get(key)
            if cal is not None or time.monotonic() > deadline or not alive():
                return cal
            time.sleep(poll_s)


def calibration_files(directories) -> Iterator[tuple[Path, dict]]:
    """(path, JSON object) of every `*.json` in `directories`, in order and by name within each: bundled tables and
    cache entries (`{"key", "calibration"}`) alike. Unreadable files and non-objects are skipped with a warning."""
    for directory in directories:
        for f in sorted(Path(directory).glob("*.json")):
            try:
                d = json.loads(f.read_text())
            except (OSError, ValueError) as e:
                logger.warning("sgl-sidp: skipping unreadable calibration table %s: %s", f, e)
                continue
            if isinstance(d, dict):
                yield f, d
            else:
                logger.warning("sgl-sidp: skipping calibration table %s: not a JSON object", f)


def find_bundled(model: str, gpu_name: str, directory: Path = BUNDLED_DIR) -> Path | None:
    """The bundled table measured on `model` (signature) and a GPU whose name holds the file's `gpu` as whole
    words ("H200" matches "NVIDIA H200" and "NVIDIA H200 NVL", not "NVIDIA H20"; "H20" does not match "NVIDIA H200"),
    a plain table or a cache entry (`plan calibrate` bundles entries). Unreadable files are skipped with a warning."""
    for f, d in calibration_files([directory]):
        table = d.get("calibration", d)
        if not isinstance(table, dict):
            continue
        gpu = str(table.get("gpu") or "")
        if gpu and table.get("model") == model and re.search(rf"\b{re.escape(gpu)}\b", gpu_name, re.IGNORECASE):
            return f
    return None


def resolve(key: CalibrationKey, flag_path: str | None, cache: CalibrationCache,
            bundled_dir: Path = BUNDLED_DIR) -> tuple[Calibration | None, str]:
    """The calibration to decide with, and where it came from (see the module doc for the order).

    Returns:
        (calibration, origin): origin is "flag <path>", "bundled <path>", "cache <path>", or
        "none" with calibration None (measure it now).

    Raises:
        OSError, ValueError, KeyError: the flag's file cannot be read.
    """
    if flag_path:
        return Calibration.load(flag_path), f"flag {flag_path}"
    bundled = find_bundled(key.model, key.gpu, bundled_dir)
    if bundled is not None:
        return Calibration.load(bundled), f"bundled {bundled}"
    cached = cache.get(key)
    if cached is not None:
        return cached, f"cache {cache.path(key)}"
    return None, "none"
