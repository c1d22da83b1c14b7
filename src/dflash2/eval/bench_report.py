"""The Markdown report of a `dflash2 bench` run (results.md), rendered from its results.json dict.

Contract: `render_markdown(results)` -> the settings, the per-dataset table at the first
concurrency (tau, autoregressive and speculative tok/s, speedup pooled and as the median of batch
pairs, TPOT, mismatches and their audit: near-ties / defects, worst margin, and beside the speedups how
much the answers repeat themselves: the mean share of repeated 4-grams, the looping answers and the
speedup on the batches with none), per-position acceptance and the tau histogram, the concurrency sweep when
there is one (with the drafts verified per cycle, the plain steps of fallback and what speculating
cost on the speculative decoder's own clock), the proposers side by side when several were
measured (`render_proposers`: per dataset and batch size, tau, speedup, tokens accepted from each
source, the tree cycles and their extra nodes), the peers table and notes (`render_peers`: a
peer under its `name` where it has one, e.g. "llama.cpp plain (bf16 GGUF)"), and the plots. A
pure function of `results`: a saved results.json renders the same report again.
"""
from __future__ import annotations

from dflash2.files.atomic import markdown_table


def render_markdown(results: dict) -> str:
    s = results["settings"]
    c0 = s["concurrency"][0]
    lines = [f"# dflash2 bench: {s['target']}\n",
             f"- draft: {s['draft']}{'' if s['trained_draft'] or s.get('proposer') == 'lookup' else ' (untrained: expect tau near 1)'}",
             f"- {len(s['datasets'])} datasets, {s['num_prompts']} prompts each, max {s['max_new_tokens']} new tokens, "
             f"T={s['temperature']}, top-p {s['top_p']}, top-k {s['top_k']}, block {s['block_size']}, "
             f"{s['device']} {s['dtype']}{_why(s)}, seed {s['seed']}",
             f"- machine: {results['machine']}; commit {results['commit']}" + _steal(results),
             "- acceptance length (tau) = committed tokens / verification passes (bonus counted); the overall row pools "
             "every cycle of every dataset (total tokens / total cycles), it is not a mean of means; speedup = "
             "autoregressive / speculative time per output token of this same engine, same prompts and batch size\n",
             f"## dflash2 at concurrency {c0}{_proposer(s)}\n"]
    rows = [[name, d["acceptance_length"], d["baseline_tokens_per_second"], d["tokens_per_second"], d["speedup"],
             d["speedup_median"], *_repetition(d), d["time_per_output_token_ms"], d["mismatches"], _audit(d),
             d["sequences"]]
            for name, d in list(results["datasets"].items()) + [("**overall**", results["overall"])]]
    lines.append(markdown_table(["dataset", "tau", "AR tok/s", "spec tok/s", "speedup", "median pair speedup",
                                 "repeated 4-grams", "looping answers", "speedup, no loops", "TPOT ms",
                                 "mismatches", "near-ties / defects (worst margin)", "sequences"], rows))
    lines.append(_loop_definition(results["overall"]))
    if "near_tie_bound" in results["overall"]:
        lines.append(f"Mismatches are against plain decoding at {s['dtype']}; each is classified at its first divergence "
                     "by the float32 target's logit margin between the two tokens: a numerical near-tie within "
                     f"{results['overall']['near_tie_bound']:g}, else a defect (a decoder fault).\n")
    lines.append(f"Mean of the per-dataset tau (as in the published tables): {results['overall']['mean_over_datasets']:.2f}\n")
    block = s["block_size"]
    lines.append("## Per-position acceptance (drafts 1..k all accepted) and tau histogram\n")
    rows = [[name] + d["position_acceptance"] for name, d in
            list(results["datasets"].items()) + [("overall", results["overall"])]]
    lines.append(markdown_table(["dataset"] + [f"k={k}" for k in range(1, block)], rows))
    rows = [[name] + [d["histogram"][tau] for tau in range(1, block + 1)] for name, d in
            list(results["datasets"].items()) + [("overall", results["overall"])]]
    lines.append(markdown_table(["dataset"] + [f"tau={t}" for t in range(1, block + 1)], rows))
    if len(s["concurrency"]) > 1:
        lines.append("## Concurrency (overall)\n")
        rows = [[c, d["acceptance_length"], d["baseline_tokens_per_second"], d["tokens_per_second"], d["speedup"],
                 d["speedup_median"], d["speedup_cpu_median"], d["drafts_verified_per_cycle"], d["plain_steps"],
                 _percent(d["speculation_overhead"]), d["mismatches"]]
                for c, d in results["overall"]["by_concurrency"].items()]
        lines.append(markdown_table(["batch", "tau", "AR tok/s", "spec tok/s", "speedup", "median pair speedup",
                                     "median pair speedup (CPU time)", "verified / cycle", "plain steps",
                                     "speculation overhead", "mismatches"], rows))
    if len(results.get("proposers", {})) > 1:
        lines.append(render_proposers(results))
    if results["peers"]:
        lines.append(render_peers(results))
    lines.append("## Plots\n")
    lines += [f"![{p}]({p})" for p in results["plots"]]
    return "\n".join(lines) + "\n"


def render_proposers(results: dict) -> str:
    """Every proposer against the one autoregressive baseline they were decoded beside, per batch size."""
    proposers = results["proposers"]
    lead = next(iter(proposers.values()))
    names = list(lead["datasets"]) + ["overall"]
    lines = [f"## Proposers side by side ({', '.join(proposers)}; one autoregressive baseline, decoded in turn "
             "batch by batch)\n"]
    for c in results["settings"]["concurrency"]:
        lines.append(f"### Batch {c}\n")
        rows = []
        for name in names:
            for proposer, report in proposers.items():
                d = (report["overall"] if name == "overall" else report["datasets"][name])["by_concurrency"][str(c)]
                accepted = d.get("accepted_by_source", {})
                rows.append([name if name != "overall" else "**overall**", proposer, d["acceptance_length"],
                             d["baseline_tokens_per_second"], d["tokens_per_second"], d["speedup"],
                             d["speedup_median"], d.get("speedup_non_looping"), accepted.get("draft", 0), accepted.get("lookup", 0),
                             accepted.get("lattice", 0), f"{d.get('tree_cycles', 0)} / {d.get('tree_extra_tokens', 0)}",
                             d["plain_steps"], d["mismatches"]])
        lines.append(markdown_table(["dataset", "proposer", "tau", "AR tok/s", "spec tok/s", "speedup",
                                     "median pair speedup", "speedup, no loops", "accepted: draft", "lookup", "lattice",
                                     "tree cycles / extra nodes", "plain steps", "mismatches"], rows))
    return "\n".join(lines) + "\n"


def render_peers(results: dict) -> str:
    lines = ["## Peers (batch 1, same prompts)\n"]
    rows = []
    for name, d in list(results["datasets"].items()) + [("overall", results["overall"])]:
        by1 = d["by_concurrency"].get("1", d)
        rows.append(["dflash2 (this engine)", name, by1["acceptance_length"], by1["tokens_per_second"],
                     by1["speedup"], by1["mismatches"]])
    for key, report in results["peers"].items():
        if report["status"] != "ok":
            continue
        for name, d in list(report["datasets"].items()) + [("overall", report["overall"])]:
            rows.append([report.get("name", key), name, d.get("acceptance_length"), d.get("tokens_per_second"), d.get("speedup"),
                         d.get("mismatches")])
    lines.append(markdown_table(["decoder", "dataset", "tau", "tok/s", "speedup", "mismatches vs dflash2 AR"], rows))
    for key, report in results["peers"].items():
        status = report["status"] + (f": {report['reason']}" if report.get("reason") else "")
        shown = f"{report['name']}, `{key}`" if report.get("name") else key
        lines.append(f"- **{shown}** ({report['description']}): {status}")
        lines += [f"  - {note}" for note in report.get("notes", [])]
    return "\n".join(lines) + "\n"


def _repetition(d: dict) -> list:
    """Mean repeated 4-gram share, looping answers of all, speedup on the batches without one."""
    rep = d.get("repetition")
    if not rep or rep["mean_share"] is None:
        return [None, None, d.get("speedup_non_looping")]
    return [f"{100 * rep['mean_share']:.0f} %", f"{rep['looping']} / {rep['answers']}", d.get("speedup_non_looping")]


def _loop_definition(overall: dict) -> str:
    rep = overall.get("repetition")
    if not rep:
        return ""
    return (f"Repeated {rep['ngram']}-grams: per answer, the share of its {rep['ngram']}-grams that repeat an earlier "
            f"one of the same answer (mean over the answers); an answer loops when that share exceeds "
            f"{rep['threshold']:g}; \"speedup, no loops\" pools the batches none of whose answers loops.\n")


def _proposer(settings: dict) -> str:
    """Which proposer the single-proposer tables show, when the run measured several."""
    several = settings.get("proposers") or []
    return f" (proposer {settings['proposer']}; all {len(several)} side by side below)" if len(several) > 1 else ""


def _steal(results: dict) -> str:
    share = results.get("machine_details", {}).get("steal_share")
    return "" if share is None else f"; {100 * share:.0f} % of the CPU's time stolen by the host during the run"


def _why(settings: dict) -> str:
    reason = settings.get("dtype_reason")
    exact = ", exact verify" if settings.get("exact_verify") else ""
    weights = settings.get("weights", "float")
    exact += "" if weights == "float" else f", {weights} weights"
    return f" ({reason}{exact})" if reason else exact


def _audit(entry: dict) -> str | None:
    """near-ties / defects (worst float32 margin) of a greedy entry's mismatches."""
    if entry.get("near_ties") is None:
        return None
    worst = entry["worst_margin"]
    shown = "" if worst is None else f" ({worst:.3g})"
    return f"{entry['near_ties']} / {entry['defects']}{shown}"


def _percent(share: float | None) -> str | None:
    return None if share is None else f"{100 * share:+.1f} %"
