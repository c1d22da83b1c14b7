"""PNG plots for `dflash2 bench` and `dflash2 analyze` (matplotlib, Agg backend: no display needed).

Contract: `bench_plots(results, out_dir)` and `analysis_plots(results, out_dir)` take the results
dicts those commands write to results.json, save their PNGs into `out_dir` and return the file
names written (relative to `out_dir`). Missing pieces (no peers, one concurrency) only drop the
corresponding series; a plot is never left half-drawn on error (figures are always closed).
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# docs/spec.md §5: published DFlash2 acceptance lengths (Qwen3.8-27B target, SGLang on one H200, T=1).
PUBLISHED_DFLASH2 = {"gsm8k": 5.46, "math500": 5.28, "humaneval": 4.39, "mbpp": 4.79, "mt-bench": 4.10}
PEER_LABELS = {"dflash_reference": "PyPI dflash 0.1.0 (reference)", "hf_prompt_lookup": "HF prompt lookup",
               "hf_generate": "HF generate (AR)"}


def _save(fig, out: Path, name: str, written: list[str]) -> None:
    try:
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        written.append(name)
    finally:
        plt.close(fig)


def _own(results: dict) -> list[tuple[str, dict, dict]]:
    """This engine's series: (label, per-dataset entries, overall entry), one per proposer measured."""
    proposers = results.get("proposers") or {}
    if len(proposers) <= 1:
        return [("dflash2 (this engine)", results["datasets"], results["overall"])]
    return [(f"dflash2 {name}", report["datasets"], report["overall"]) for name, report in proposers.items()]


def _ok_peers(results: dict) -> dict:
    return {k: v for k, v in results.get("peers", {}).items() if v.get("status") == "ok"}


def bench_plots(results: dict, out: str | Path) -> list[str]:
    out = Path(out)
    written: list[str] = []
    _acceptance_bars(results, out, written)
    _position_curves(results, out, written)
    _throughput(results, out, written)
    _histogram(results, out, written)
    return written


def _acceptance_bars(results: dict, out: Path, written: list[str]) -> None:
    names = list(results["datasets"]) + ["overall"]
    series = [(label, [datasets[n]["acceptance_length"] for n in names[:-1]] + [overall["acceptance_length"]])
              for label, datasets, overall in _own(results)]
    for key, report in _ok_peers(results).items():
        if key == "hf_generate":
            continue  # autoregressive: tau = 1 by definition
        values = [report["datasets"].get(n, {}).get("acceptance_length") for n in names[:-1]]
        series.append((PEER_LABELS.get(key, key), values + [report["overall"].get("acceptance_length")]))
    published = [PUBLISHED_DFLASH2.get(n) for n in names[:-1]] + [None]
    show_published = any(v is not None for v in published)
    groups = len(series) + (1 if show_published else 0)
    width = 0.8 / groups
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(names) + 2), 4.2))
    for i, (label, values) in enumerate(series):
        xs = [j + (i - (groups - 1) / 2) * width for j in range(len(names))]
        ax.bar(xs, [v or 0 for v in values], width, label=label)
        for x, v in zip(xs, values):
            if v:
                ax.text(x, v, f"{v:.2f}", ha="center", va="bottom", fontsize=7)
    if show_published:
        xs = [j + (groups - 1 - (groups - 1) / 2) * width for j in range(len(names))]
        ax.bar(xs, [v or 0 for v in published], width, fill=False, hatch="//", edgecolor="gray",
               label="published DFlash2 (Qwen3.8-27B, H200, T=1)")
    ax.axhline(1.0, color="black", linewidth=0.6, linestyle=":")
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("acceptance length (tokens / verification)")
    s = results["settings"]
    ax.set_title(f"Acceptance length, block {s['block_size']}, T={s['temperature']} ({s['target']})")
    ax.legend(fontsize=7, loc="upper right")
    _save(fig, out, "acceptance_length.png", written)


def _position_curves(results: dict, out: Path, written: list[str]) -> None:
    block = results["settings"]["block_size"]
    ks = list(range(1, block))
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, d in results["datasets"].items():
        ax.plot(ks, d["position_acceptance"], marker="o", linewidth=1, label=name)
    ax.plot(ks, results["overall"]["position_acceptance"], color="black", linewidth=2.2, marker="s",
            label="overall (dflash2)")
    reference = _ok_peers(results).get("dflash_reference")
    if reference:
        taus = [t for d in reference["datasets"].values() for t in d.get("acceptance_lengths_per_cycle", [])]
        if taus:
            ax.plot(ks, [sum(t - 1 >= k for t in taus) / len(taus) for k in ks], color="gray", linestyle="--",
                    linewidth=2, label="overall (PyPI dflash)")
    ax.set_xlabel("block position k")
    ax.set_ylabel("fraction of cycles with drafts 1..k accepted")
    ax.set_ylim(0, 1.02)
    ax.set_xticks(ks)
    ax.set_title("Per-position acceptance")
    ax.legend(fontsize=7)
    _save(fig, out, "position_acceptance.png", written)


def _throughput(results: dict, out: Path, written: list[str]) -> None:
    by_c = results["overall"]["by_concurrency"]
    cs = [int(c) for c in by_c]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.plot(cs, [by_c[str(c)]["baseline_tokens_per_second"] for c in cs], marker="o", label="autoregressive (same engine)")
    own = _own(results)
    for label, _, overall in own:
        mine = overall["by_concurrency"]
        ax.plot(cs, [mine[str(c)]["tokens_per_second"] for c in cs], marker="s",
                label="speculative (dflash2)" if len(own) == 1 else label)
        for c in cs:
            d = mine[str(c)]
            if d["speedup"]:
                ax.annotate(f"{d['speedup']:.2f}x", (c, d["tokens_per_second"]), textcoords="offset points",
                            xytext=(4, 6), fontsize=8)
    for i, (key, report) in enumerate(_ok_peers(results).items()):
        tps = report["overall"].get("tokens_per_second")
        if tps:
            ax.scatter([1], [tps], marker="^v<>"[i % 4], s=60, zorder=3, color=f"C{i + 1 + len(own)}",
                       label=f"{PEER_LABELS.get(key, key)} (batch 1)")
    if len(cs) > 1:
        ax.set_xscale("log", base=2)
    ax.set_xticks(cs, [str(c) for c in cs])
    ax.set_xlabel("concurrency (batch size)")
    ax.set_ylabel("output tokens / s (all sequences)")
    ax.set_ylim(bottom=0)
    ax.set_title("Throughput vs concurrency (overall)")
    ax.legend(fontsize=7)
    _save(fig, out, "throughput_concurrency.png", written)


def _histogram(results: dict, out: Path, written: list[str]) -> None:
    hist = results["overall"]["histogram"]
    taus = [int(t) for t in hist]
    total = sum(hist.values()) or 1
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    width = 0.4
    ax.bar([t - width / 2 for t in taus], [hist[t] / total for t in hist], width, label="dflash2")
    reference = _ok_peers(results).get("dflash_reference")
    if reference:
        ref = [t for d in reference["datasets"].values() for t in d.get("acceptance_lengths_per_cycle", [])]
        if ref:
            ax.bar([t + width / 2 for t in taus], [ref.count(t) / len(ref) for t in taus], width,
                   label="PyPI dflash (reference)")
    ax.set_xticks(taus)
    ax.set_xlabel("tokens committed per verification (tau)")
    ax.set_ylabel("fraction of cycles")
    ax.set_title("Acceptance length histogram (overall)")
    ax.legend(fontsize=8)
    _save(fig, out, "histogram.png", written)


# --------------------------------------------------------------------------- analyze


def analysis_plots(results: dict, out: str | Path) -> list[str]:
    out = Path(out)
    written: list[str] = []
    recall = results["recall"]
    ks = list(range(1, len(recall["top1"]) + 1))
    k = results["settings"]["top_k"]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.plot(ks, recall["top1"], marker="o", label="top-1 recall")
    ax.plot(ks, recall["topk"], marker="s", label=f"top-{k} recall (ideal picker, per position)")
    ax.plot(ks, recall["topk_given_prefix"], marker="^", label=f"top-{k} recall given positions < k in top-{k}")
    ax.plot(ks, recall["oracle_reach"], marker="v", linestyle="--", label=f"ideal top-{k} picker reaches k")
    if recall.get("top1_convs_off"):
        ax.plot(ks, recall["top1_convs_off"], marker="o", linestyle=":", color="gray", label="top-1, convs off")
    ax.set_ylim(0, 1.02)
    ax.set_xticks(ks)
    ax.set_xlabel("block position k")
    ax.set_ylabel("fraction of blocks")
    ax.set_title("Recall per block position (suffix decay), teacher-forced")
    ax.legend(fontsize=7)
    _save(fig, out, "recall_suffix_decay.png", written)

    acc = results["acceptance"]
    labels = ["argmax", "selector (greedy walk)", f"oracle (best path in top-{k})"]
    keys = ["argmax", "selector", "oracle"]
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for i, (variant, shade) in enumerate((("convs_on", None), ("convs_off", "gray"))):
        if variant not in acc:
            continue
        values = [acc[variant].get(key) or 0 for key in keys]
        xs = [j + (i - 0.5) * 0.38 for j in range(len(keys))]
        ax.bar(xs, values, 0.38, color=shade, label=variant.replace("_", " "))
        for x, v in zip(xs, values):
            ax.text(x, v, f"{v:.2f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(keys)), labels)
    ax.set_ylabel("mean acceptance length (teacher-forced)")
    ax.set_title("Selector vs argmax vs oracle")
    ax.legend(fontsize=8)
    _save(fig, out, "selector_acceptance.png", written)

    share = results["attention_share"]
    layers = list(range(1, len(share["convs_on"]) + 1))
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.bar([x - 0.19 for x in layers], [100 * v for v in share["convs_on"]], 0.38, label="convs on")
    ax.bar([x + 0.19 for x in layers], [100 * v for v in share["convs_off"]], 0.38, color="gray", label="convs off")
    ax.set_xticks(layers)
    ax.set_xlabel("draft layer")
    ax.set_ylabel("in-block attention share (%)")
    ax.set_title("Attention mass block queries put on block keys")
    ax.legend(fontsize=8)
    _save(fig, out, "attention_share.png", written)

    lat = results["latency"]["microbench_ms"]
    parts = [("target verify", lat["verify"]), ("draft (no convs)", lat["draft_without_convs"]),
             ("convs", max(lat["convs"], 0.0)), ("selector", lat["selector"]), ("context K/V", lat["context_kv"])]
    fig, ax = plt.subplots(figsize=(7.5, 3.2))
    left = 0.0
    for label, value in parts:
        ax.barh([0], [value], left=left, label=f"{label} {value:.2f} ms")
        left += value
    ax.set_yticks([])
    ax.set_xlabel("ms per draft-verify cycle (median)")
    ax.set_title("Cycle latency breakdown")
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.32))
    _save(fig, out, "latency_breakdown.png", written)
    return written
