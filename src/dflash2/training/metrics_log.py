"""Training metrics on disk: a JSONL log and a PNG of the learning curves.

Contract:
- `MetricsLog(path)` appends one JSON object per line and flushes it (a crash loses nothing already
  logged). Every record has `split` ("train" or "eval"), `step` and `tokens` (real sequence tokens
  seen so far, all ranks).
- `truncate_after(step)` drops records logged after `step`: a resumed run rewinds its log to the
  checkpoint, so the log of a resumed run equals that of an uninterrupted one (timings aside).
- `plot_curves(jsonl, png)` draws loss (token CE, selector CE, total) and teacher-forced acceptance
  length (tau with the selector, tau_base without) against tokens, train and eval, with the
  matplotlib Agg backend, written atomically.
"""
from __future__ import annotations

import json
from pathlib import Path

from dflash2.files.atomic import atomic_write


class MetricsLog:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, record: dict) -> None:
        with open(self.path, "a") as handle:
            handle.write(json.dumps(record) + "\n")
            handle.flush()

    def records(self) -> list[dict]:
        if not self.path.is_file():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a torn last line after a crash
                continue
        return out

    def truncate_after(self, step: int) -> None:
        kept = [r for r in self.records() if r.get("step", 0) <= step]
        with atomic_write(self.path, "w") as handle:
            for record in kept:
                handle.write(json.dumps(record) + "\n")


def plot_curves(jsonl: str | Path, png: str | Path) -> None:
    import matplotlib   # plotting only: loaded when a figure is drawn, not for every command's start-up
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = MetricsLog(jsonl).records()
    if not records:
        return
    fig, (ax_loss, ax_tau) = plt.subplots(1, 2, figsize=(11, 4))
    for split, style in (("train", "-"), ("eval", "o--")):
        rows = [r for r in records if r.get("split") == split]
        if not rows:
            continue
        tokens = [r["tokens"] for r in rows]
        for key in ("loss", "loss_ce", "loss_selector", "loss_selector_in_topk"):
            if all(key in r for r in rows):
                ax_loss.plot(tokens, [r[key] for r in rows], style, label=f"{split} {key}", markersize=3)
        for key in ("tau", "tau_base"):
            if all(key in r for r in rows):
                ax_tau.plot(tokens, [r[key] for r in rows], style, label=f"{split} {key}", markersize=3)
    ax_loss.set_xlabel("tokens")
    ax_loss.set_ylabel("loss")
    ax_loss.set_yscale("log")
    ax_tau.set_xlabel("tokens")
    ax_tau.set_ylabel("teacher-forced acceptance length")
    for ax in (ax_loss, ax_tau):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    with atomic_write(png, "wb") as handle:
        fig.savefig(handle, format="png", dpi=100)
    plt.close(fig)
