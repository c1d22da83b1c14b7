"""What a proposer is told besides the target's features: the committed token after each position
whose features it gets (an MTP head pairs the hidden state at p - 1 with the token at p; a DFlash
draft reads the features alone and ignores it).

Contract:
- `prompt_following(prompts, first, width)`: after a prefill, left-padded like it to `width`: each
  prompt's next tokens, then the first generated token (first [n]) -> [n, width].
- `cycle_following(path, accepted, bonus)`: after a cycle's verify pass: path [b, W] (the anchor and
  the verified path, a tree's winning path), accepted [b], bonus [b] -> [b, W]: the accepted tokens,
  then the bonus token at index accepted[r]; what follows is not committed (and the proposer keeps
  only the first accepted[r] + 1 positions).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def prompt_following(prompts: list[list[int]], first: torch.Tensor, width: int) -> torch.Tensor:
    out = torch.zeros(len(prompts), width, dtype=torch.long)
    for row, (prompt, token) in enumerate(zip(prompts, first.tolist())):
        out[row, width - len(prompt):] = torch.tensor(prompt[1:] + [token])
    return out.to(first.device)


def cycle_following(path: torch.Tensor, accepted: torch.Tensor, bonus: torch.Tensor) -> torch.Tensor:
    return F.pad(path[:, 1:], (0, 1)).scatter(1, accepted[:, None], bonus[:, None])    # [b, W]
