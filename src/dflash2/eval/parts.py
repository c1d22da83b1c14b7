"""Resumable `dflash2 bench` runs: each finished unit of work is saved as a JSON part.

A full protocol run (5 datasets, T=0 and T=1, three batch sizes, three peers) takes hours on a
small CPU; parts let it be stopped and continued (`dflash2 bench ... --resume`) without redoing or
mixing anything.

Contract:
- `run_fingerprint(settings, model_weights, code_dir)` -> a sha256 hex of everything a part's
  numbers depend on: the bench settings (datasets, prompts, tokens, sampling, batch sizes, device,
  dtype, seed, peers), the target's and draft's weights (tensor bytes, `weights_digest`), and the
  source of the dflash2 package (`code_digest`: every .py file under `code_dir`, by default the
  whole package -- the decoding loop and policy decide the numbers as much as the bench does).
- `PartStore(out_dir, fingerprint, resume)`: `save(unit, payload)` writes
  `<out_dir>/parts/<unit>.json` atomically, tagged with the fingerprint and the time; `load(unit)`
  returns the payload only when resuming and the saved fingerprint is identical, else None (a part
  of another configuration is never reused; it is overwritten when its unit is recomputed).
  `reused` lists the units loaded.
"""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import torch

from dflash2.files.atomic import atomic_write


def weights_digest(*modules) -> str:
    """sha256 over the parameters and buffers (names, shapes, dtypes, bytes) of the given modules."""
    digest = hashlib.sha256()
    for module in modules:
        if module is None:
            digest.update(b"<none>")
            continue
        for name, tensor in sorted(module.state_dict().items()):
            data = tensor.detach().to("cpu").contiguous()
            digest.update(f"{name}:{tuple(data.shape)}:{data.dtype}".encode())
            digest.update(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    return digest.hexdigest()


def code_digest(code_dir: str | Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(Path(code_dir).rglob("*.py")):
        digest.update(str(path.relative_to(code_dir)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


PACKAGE_DIR = Path(__file__).resolve().parents[1]   # src/dflash2


def run_fingerprint(settings: dict, model_weights: str, code_dir: str | Path = PACKAGE_DIR) -> str:
    text = json.dumps({"settings": settings, "weights": model_weights, "code": code_digest(code_dir)},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


class PartStore:
    def __init__(self, out_dir: str | Path, fingerprint: str, resume: bool):
        self.root = Path(out_dir) / "parts"
        self.fingerprint = fingerprint
        self.resume = resume
        self.reused: list[str] = []

    def _path(self, unit: str) -> Path:
        return self.root / f"{unit}.json"

    def load(self, unit: str):
        path = self._path(unit)
        if not (self.resume and path.is_file()):
            return None
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            return None
        if record.get("fingerprint") != self.fingerprint:
            return None
        self.reused.append(unit)
        return record["payload"]

    def save(self, unit: str, payload) -> None:
        record = {"fingerprint": self.fingerprint, "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                  "payload": payload}
        with atomic_write(self._path(unit), "w") as handle:
            json.dump(record, handle)
