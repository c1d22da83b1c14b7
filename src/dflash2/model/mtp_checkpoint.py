"""MTP heads on disk: the head's own checkpoints, and the `mtp.*` tensors a target ships.

Contract:
- `save_mtp_head(head, path)` writes `config.json` (`MtpConfig.to_dict`) and `model.safetensors`
  with the target checkpoints' names (`mtp.fc.weight`, `mtp.layers.0. ...`), atomically
  (`model.draft.write_checkpoint`); `load_mtp_head(path, dtype, device)` reads one back, refusing
  a bad config, missing / misshapen / unexpected tensors and NaN / inf in one line
  (`model.draft.read_checked_weights`). `is_mtp_checkpoint(path)`: a directory whose config.json
  is an MTP head's.
- `target_mtp_state(directory)`: the target checkpoint's own MTP layer (Qwen3.5 / Qwen3.6 /
  Qwen3.8 and Qwen3-Next ship one, as `mtp.*` tensors that transformers drops on load), read from
  its safetensors files directly (a sharded index included), the prefix removed and MoE experts
  stored one per tensor (`mlp.experts.<e>.gate_proj.weight`, ...) merged into the fused layout
  transformers' layers use (`mlp.experts.gate_up_proj` [E, 2I, H], `mlp.experts.down_proj`
  [E, H, I]); None when it has none. A checkpoint declaring more than one MTP layer
  (`mtp_num_hidden_layers` / `num_nextn_predict_layers`) is refused in one line.
- `head_from_target(directory, target_config, block_size, mask_token_id)`: an `MtpHead` holding the
  target's own MTP weights (`origin: "target"`), checked like a checkpoint; None without them.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import safe_open

from dflash2.errors import DFlash2Error, require
from dflash2.model.draft import CONFIG_FILE, read_checked_weights, write_checkpoint
from dflash2.model.mtp import MTP_ARCH, MtpConfig, MtpHead
from dflash2.files.userjson import parse_json
from dflash2.files.weights import require_finite

PREFIX = "mtp."
_EXPERT = re.compile(r"^(layers\.0\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")


def save_mtp_head(head: MtpHead, path: str | Path) -> None:
    write_checkpoint(path, {PREFIX + name: t for name, t in head.state_dict().items()}, head.config.to_dict())


def _read_json(file: Path, what: str) -> dict:
    require(file.is_file(), f"{what} has no {file.name}")
    try:
        raw = parse_json(file.read_text(encoding="utf-8"), f"{what} {file.name}")
    except UnicodeDecodeError:
        raise DFlash2Error(f"{what}: '{file}' is not UTF-8 text") from None
    require(isinstance(raw, dict), f"{what}: '{file}' must hold a JSON object")
    return raw


def is_mtp_checkpoint(path: str | Path) -> bool:
    try:
        return json.loads((Path(path) / CONFIG_FILE).read_text(encoding="utf-8")).get("architectures") == [MTP_ARCH]
    except (OSError, ValueError, AttributeError, RecursionError):   # the draft loader says what is wrong
        return False


def load_mtp_head(path: str | Path, dtype: torch.dtype = torch.float32,
                  device: str | torch.device = "cpu") -> MtpHead:
    path = Path(path)
    what = f"MTP head '{path}'"
    require(path.is_dir(), f"{what} is not a directory with config.json and weights")
    try:
        config = MtpConfig.from_dict(_read_json(path / CONFIG_FILE, what))
    except DFlash2Error as err:
        raise DFlash2Error(f"{what}: {err}") from None
    head = MtpHead(config)
    state = read_checked_weights(path, {n: t.shape for n, t in head.state_dict().items()}, what, prefix=PREFIX)
    head.load_state_dict(state)
    return head.to(device=device, dtype=dtype).eval()


def _declared_layers(config: dict) -> int | None:
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    for source in (config, text):
        for key in ("mtp_num_hidden_layers", "num_nextn_predict_layers"):
            if isinstance(source.get(key), int):
                return source[key]
    return None


def _weight_map(directory: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it (a sharded checkpoint's index, or every file)."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        mapping = _read_json(index, f"target '{directory}'").get("weight_map", {})
        return {name: directory / file for name, file in mapping.items()}
    names = {}
    for file in sorted(directory.glob("*.safetensors")):
        with safe_open(str(file), "pt") as handle:
            names.update({name: file for name in handle.keys()})
    return names


def _fuse_experts(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Experts one per tensor -> transformers' fused tensors (see the contract)."""
    experts: dict[int, dict[str, torch.Tensor]] = {}
    fused = {}
    for name, tensor in state.items():
        match = _EXPERT.match(name)
        if match is None:
            fused[name] = tensor
        else:
            experts.setdefault(int(match.group(2)), {})[match.group(3)] = tensor
    if not experts:
        return fused
    count = max(experts) + 1
    require(sorted(experts) == list(range(count)) and all(len(e) == 3 for e in experts.values()),
            "the target's MTP layer has an incomplete set of expert tensors")
    fused["layers.0.mlp.experts.gate_up_proj"] = torch.stack(
        [torch.cat([experts[e]["gate"], experts[e]["up"]], dim=0) for e in range(count)])      # [E, 2I, H]
    fused["layers.0.mlp.experts.down_proj"] = torch.stack([experts[e]["down"] for e in range(count)])  # [E, H, I]
    return fused


def target_mtp_state(directory: str | Path) -> dict[str, torch.Tensor] | None:
    directory = Path(directory)
    if not directory.is_dir():
        return None
    config = _read_json(directory / CONFIG_FILE, f"target '{directory}'")
    declared = _declared_layers(config)
    names = {name: file for name, file in _weight_map(directory).items() if name.startswith(PREFIX)}
    if not names:
        return None
    require(declared in (None, 1), f"target '{directory}' declares {declared} MTP layers; dflash2 runs a "
                                   f"target's MTP head of one layer")
    state = {}
    for file in sorted(set(names.values())):
        with safe_open(str(file), "pt") as handle:
            for name in handle.keys():
                if name in names:
                    state[name.removeprefix(PREFIX)] = handle.get_tensor(name)
    for name, tensor in state.items():
        require_finite(name, tensor, f"target '{directory}' MTP layer")
    return _fuse_experts(state)


def head_from_target(directory: str | Path, target_config, block_size: int = 8,
                     mask_token_id: int = 0) -> MtpHead | None:
    state = target_mtp_state(directory)
    if state is None:
        return None
    head = MtpHead(MtpConfig.for_target(target_config, block_size, mask_token_id, origin="target"))
    expected = head.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    what = f"target '{directory}' MTP layer"
    require(not missing, f"{what} lacks tensor 'mtp.{missing[0]}'" if missing else "")
    require(not unexpected, f"{what} has tensor 'mtp.{unexpected[0]}', which its family's layer does not"
            if unexpected else "")
    for name, tensor in expected.items():
        require(tuple(state[name].shape) == tuple(tensor.shape),
                f"{what}: tensor 'mtp.{name}' has shape {tuple(state[name].shape)}, the target's config implies "
                f"{tuple(tensor.shape)}")
    head.load_state_dict({n: t.float() for n, t in state.items()})
    return head.eval()
