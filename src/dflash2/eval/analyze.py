"""`dflash2 analyze`: where a draft's acceptance comes from (the DFlash2 motivation analyses, docs/spec.md §1).

Contract: `main(argv)` (and `run_analysis(pipe, settings: AnalyzeSettings)` for a pre-built `Pipeline`) takes the first
turn of `--num-prompts` prompts of `--dataset` (comma list allowed; or `--dataset-file`), lets the
target decode each greedily (autoregressive, the SAME engine without a draft), then, teacher-forced
on prompt + that continuation, runs the draft block `[anchor, MASK...]` at every anchor position
of the continuation (context = the target's features strictly before the anchor) and compares
block position k's prediction with the target's own token at anchor + k. It reports:
(a) top-1 and top-K (K = `--top-k`, 16) recall per block position;
(b) mean acceptance length of full blocks for plain per-position argmax, the draft's greedy
    selector walk, and an ORACLE that picks the best path inside the top-K lists (longest prefix of
    the target's continuation; = 1 + leading positions whose true token is in the top K);
(c) suffix decay: top-K recall per position, the same given every earlier position was in the
    top K, and the fraction of blocks an ideal top-K picker reaches position k;
(d) in-block attention share per draft layer (attention probability mass that block queries put
    on block keys rather than context keys, averaged over heads and block queries), convs on and
    off (`draft.conv_enabled = False`); probabilities are recomputed from each attention module's
    own projections and checked against its real output (`recompute_max_error`: max absolute
    difference over the output's max absolute value; ~1e-7 in fp32, ~1e-2 in bf16);
(e) the selector's and the convs' share of one draft-verify cycle: medians of interleaved timings
    (microbench style) and the engine's own phase times on real speculative decoding.
Writes OUTPUT/results.json, results.md and PNGs (`plots.analysis_plots`).
"""
from __future__ import annotations

import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from dflash2.argparsing import ModelSettings, OneLineParser, add_model_arguments, parse_list
from dflash2.data.prompts import load_conversations
from dflash2.eval import plots
from dflash2.files.atomic import check_output, markdown_table, write_json, write_text
from dflash2.pipeline import build_pipeline
from dflash2.runtime.provenance import git_commit, machine_info, machine_line
from dflash2.targets.chat import first_turns
from dflash2.model.mask import block_visibility
from dflash2.decoding.loop.engine import GenerationConfig
from dflash2.errors import require
from dflash2.pipeline import Pipeline
from dflash2.decoding.proposers.draft import DraftProposer
from dflash2.decoding.loop.timing import Stopwatch


@dataclass(frozen=True)
class AnalyzeSettings:
    """What `dflash2 analyze` measures, on which models."""
    model: ModelSettings = field(default_factory=ModelSettings)
    datasets: tuple[str, ...] = ("gsm8k",)
    dataset_files: tuple[str, ...] = ()
    num_prompts: int = 8
    max_new_tokens: int = 128     # length of the target's greedy continuation
    top_k: int = 16               # K of the top-K recall and of the oracle picker
    anchors_per_pass: int = 16    # draft blocks evaluated in one forward
    repeats: int = 15             # timing repeats for the latency shares
    output: str = "runs/analyze"

    def validate(self) -> "AnalyzeSettings":
        for name in ("num_prompts", "top_k", "repeats", "max_new_tokens", "anchors_per_pass"):
            value = getattr(self, name)
            require(value > 0, f"--{name.replace('_', '-')} must be positive, got {value}")
        check_output(self.output)
        return self


def parse_args(argv) -> AnalyzeSettings:
    p = OneLineParser(prog="dflash2 analyze", description="Recall, oracle selector, suffix decay, "
                                "in-block attention share and latency shares of a draft.")
    add_model_arguments(p)
    p.add_argument("--dataset", default="gsm8k", help="benchmark name(s), comma separated")
    p.add_argument("--dataset-file", action="append", default=None,
                   help="JSONL prompts instead of (or besides) --dataset (repeat for several)")
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=128, help="length of the target's greedy continuation")
    p.add_argument("--top-k", type=int, default=16, help="K of the top-K recall and of the oracle picker")
    p.add_argument("--anchors-per-pass", type=int, default=16, help="draft blocks evaluated in one forward")
    p.add_argument("--repeats", type=int, default=15, help="timing repeats for the latency shares")
    p.add_argument("--output", default="runs/analyze")
    args = p.parse_args(argv)
    datasets = () if args.dataset.strip().lower() in ("", "none") else tuple(parse_list(args.dataset, "--dataset"))
    return AnalyzeSettings(ModelSettings.from_args(args), datasets, tuple(args.dataset_file or ()), args.num_prompts,
                           args.max_new_tokens, args.top_k, args.anchors_per_pass, args.repeats,
                           args.output).validate()


class AttentionProbe:
    """Forward hooks on every draft attention module: in-block share of the attention probabilities."""

    def __init__(self, draft):
        self.layers = [layer.self_attn for layer in draft.layers]
        self.mass = [0.0] * len(self.layers)
        self.count = [0] * len(self.layers)
        self.max_error = 0.0      # max |recomputed - real| output, over max |real| output
        self.handles = []

    def __enter__(self):
        self.handles = [m.register_forward_hook(self._hook(i)) for i, m in enumerate(self.layers)]
        return self

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()

    def shares(self) -> list[float]:
        return [m / c if c else 0.0 for m, c in zip(self.mass, self.count)]

    def _hook(self, index: int):
        def hook(module, inputs, output):
            x, rope, context, mask = inputs
            b, q_len, _ = x.shape
            q, k_block, v_block = module.block_qkv(x, rope)
            q = q.float()                                                             # [b, heads, Q, d]
            group = module.heads // module.kv_heads
            k = torch.cat([context[0], k_block], dim=2).float().repeat_interleave(group, dim=1)
            v = torch.cat([context[1], v_block], dim=2).float().repeat_interleave(group, dim=1)
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(module.head_dim)
            probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)  # [b, heads, Q, S+Q]
            in_block = probs[..., context[0].shape[2]:].sum(-1)
            self.mass[index] += float(in_block.sum())
            self.count[index] += in_block.numel()
            redo = module.o_proj((probs @ v).transpose(1, 2).reshape(b, q_len, -1).to(x.dtype))
            relative = (redo - output).abs().max() / output.abs().max().clamp_min(1e-30)
            self.max_error = max(self.max_error, float(relative))
        return hook


class Tally:
    """Teacher-forced counts over blocks, for one draft variant (convs on or off)."""

    def __init__(self, positions: int):
        self.valid = torch.zeros(positions, dtype=torch.float64)
        self.top1 = torch.zeros(positions, dtype=torch.float64)
        self.topk = torch.zeros(positions, dtype=torch.float64)
        self.cond_den = torch.zeros(positions, dtype=torch.float64)
        self.cond_num = torch.zeros(positions, dtype=torch.float64)
        self.reach = torch.zeros(positions, dtype=torch.float64)
        self.full_blocks = 0
        self.tau = {"argmax": 0.0, "selector": 0.0, "oracle": 0.0}
        self.tree_tau = torch.zeros(positions, dtype=torch.float64)    # [L] main + second path cut to L nodes
        self.tree_nodes = torch.zeros(positions, dtype=torch.float64)  # [L] the nodes that branch adds

    def add(self, labels, top1, topk_ids, selector_tokens, second=None) -> None:
        """labels / top1 / selector_tokens [n, T], topk_ids [n, T, K]; `second` the lattice's
        `SecondPath` (None without a selector: the tree columns stay the selector's own)."""
        labels, top1, topk_ids, selector_tokens = (t.cpu() for t in (labels, top1, topk_ids, selector_tokens))
        valid = labels >= 0
        hit1 = ((top1 == labels) & valid).long()
        hitk = ((topk_ids == labels[..., None]).any(-1) & valid).long()
        before = torch.cat([torch.ones_like(hitk[:, :1]), hitk[:, :-1].cumprod(-1)], dim=1).bool()
        self.valid += valid.sum(0)
        self.top1 += hit1.sum(0)
        self.topk += hitk.sum(0)
        self.cond_den += (before & valid).sum(0)
        self.cond_num += (before & hitk.bool()).sum(0)
        full = valid.all(-1)
        self.full_blocks += int(full.sum())
        self.reach += hitk[full].cumprod(-1).sum(0)
        self.tau["argmax"] += float((1 + hit1[full].cumprod(-1).sum(-1)).sum())
        self.tau["oracle"] += float((1 + hitk[full].cumprod(-1).sum(-1)).sum())
        main = ((selector_tokens == labels) & valid).long()[full].cumprod(-1).sum(-1)        # [f] accepted
        self.tau["selector"] += float((1 + main).sum())
        positions = labels.shape[1]
        if second is None:
            self.tree_tau += float((1 + main).sum())
            return
        tokens, fork = second.tokens.cpu()[full], second.fork.cpu()[full]
        other = (tokens == labels[full]).long().cumprod(-1).sum(-1)                           # [f]
        for cut in range(1, positions + 1):     # the second branch keeps its first `cut` nodes past the fork
            reach = torch.minimum(other, fork + cut)
            self.tree_tau[cut - 1] += float((1 + torch.maximum(main, reach)).sum())
            self.tree_nodes[cut - 1] += float(torch.clamp(positions - fork, max=cut).sum())

    def recall(self) -> dict:
        def ratio(num, den):
            return [float(n / d) if d else 0.0 for n, d in zip(num, den)]
        return {"top1": ratio(self.top1, self.valid), "topk": ratio(self.topk, self.valid),
                "topk_given_prefix": ratio(self.cond_num, self.cond_den),
                "oracle_reach": [float(r / self.full_blocks) if self.full_blocks else 0.0 for r in self.reach],
                "blocks_per_position": [int(v) for v in self.valid]}

    def acceptance(self) -> dict:
        return {k: v / self.full_blocks if self.full_blocks else None for k, v in self.tau.items()}

    def lattice_tree(self) -> dict:
        """The selector's path and its second path (`CandidateSelector.second_path`) as a token tree,
        the second branch cut to 1..T nodes: per cut, tau of the tree and the nodes the branch adds
        (the main path has T), per full block."""
        n = max(self.full_blocks, 1)
        return {"tau": [float(v / n) for v in self.tree_tau], "extra_nodes": [float(v / n) for v in self.tree_nodes]}


@torch.inference_mode()
def teacher_forced(pipe: Pipeline, sequences: list[tuple[int, list[int]]], args: AnalyzeSettings, tallies: dict, probes: dict) -> None:
    """Run the draft at every anchor of every continuation, convs on and (if any) off."""
    adapter, draft = pipe.decoder.target, pipe.decoder.draft
    cfg = draft.config
    block, device = cfg.block_size, adapter.device
    top_k = min(args.top_k, cfg.vocab_size)
    for prompt_len, ids in tqdm(sequences, desc="teacher-forced blocks", unit="seq"):
        tokens = torch.tensor(ids, device=device)
        _, features = adapter.features(tokens[None])
        context = draft.context_kv(features, torch.arange(len(ids), device=device)[None])
        padded = torch.cat([tokens, tokens.new_full((block,), -1)])
        for first in range(prompt_len, len(ids) - 1, args.anchors_per_pass):
            anchors = torch.arange(first, min(first + args.anchors_per_pass, len(ids) - 1), device=device)
            positions = anchors[:, None] + torch.arange(block, device=device)                   # [n, B]
            labels = padded[positions[:, 1:]]                                                    # [n, B-1]
            block_ids = torch.full_like(positions, cfg.mask_token_id)
            block_ids[:, 0] = tokens[anchors]
            mask = block_visibility(positions[None], torch.arange(len(ids), device=device), cfg.sliding_window)
            for variant, tally in tallies.items():
                draft.conv_enabled = variant == "convs_on"
                with probes[variant]:
                    hidden = draft.forward_blocks(block_ids[None], positions[None], context, mask)[0][:, 1:]
                logits = draft.logits(hidden)                    # [n, T, Vd]: ids in the draft vocabulary
                top1 = draft.draft_to_target(logits.argmax(-1))  # target ids, as the labels are
                selector_tokens, second = top1, None
                if draft.selector is not None:
                    cand_logits, cand = logits.topk(min(draft.selector.top_k, logits.shape[-1]), dim=-1)
                    cand_ids = draft.draft_to_target(cand)
                    scores = draft.selector.pair_scores(hidden, block_ids[:, 0], cand_ids, cand_logits)
                    path = draft.selector.walk(scores, cand_ids, 0.0)
                    selector_tokens, second = path.tokens, draft.selector.second_path(scores, cand_ids, path)
                topk_ids = draft.draft_to_target(logits.topk(min(top_k, logits.shape[-1]), dim=-1).indices)
                tally.add(labels, top1, topk_ids, selector_tokens, second)
    draft.conv_enabled = True


def latency(pipe: Pipeline, prompt: list[int], repeats: int) -> dict:
    """Median ms of each cycle component on one prompt's cache; convs on/off interleaved."""
    adapter, draft = pipe.decoder.target, pipe.decoder.draft
    block, device = draft.config.block_size, adapter.device
    sync = torch.cuda.synchronize if adapter.device.type == "cuda" else (lambda: None)
    _, features = adapter.prefill([prompt])
    proposer = DraftProposer(draft, Stopwatch(device))
    proposer.add_rows(features, adapter.mask)
    anchors = torch.tensor([prompt[-1]], device=device)
    start = adapter.next_position.clone()
    samples: dict[str, list[float]] = {k: [] for k in ("draft_with_convs", "draft_without_convs", "selector",
                                                       "verify", "context_kv")}
    new_features = features[:, -block:]
    for r in tqdm(range(repeats + 1), desc="latency", unit="rep", leave=False):
        for conv_on in (True, False) if draft.config.use_conv else (True,):
            draft.conv_enabled = conv_on
            proposer.stopwatch = watch = Stopwatch(device)
            proposal = proposer.propose(anchors, start, block, 0.0)
            if r:
                samples["draft_with_convs" if conv_on else "draft_without_convs"].append(
                    watch.totals["draft"] + watch.totals.get("draft_head", 0.0))
                if conv_on:
                    samples["selector"].append(watch.totals.get("selector", 0.0))
        draft.conv_enabled = True
        sync()
        clock = time.perf_counter()
        adapter.step(torch.cat([anchors[:, None], proposal.tokens], dim=1))
        adapter.keep(torch.zeros(1, dtype=torch.long), block)
        sync()
        verify = time.perf_counter() - clock
        clock = time.perf_counter()
        with torch.inference_mode():
            draft.context_kv(new_features, start[:, None] + torch.arange(block, device=device))
        sync()
        if r:
            samples["verify"].append(verify)
            samples["context_kv"].append(time.perf_counter() - clock)
    adapter.reset()
    ms = {k: 1000 * statistics.median(v) if v else 0.0 for k, v in samples.items()}
    if not samples["draft_without_convs"]:
        ms["draft_without_convs"] = ms["draft_with_convs"]
    ms["convs"] = ms["draft_with_convs"] - ms["draft_without_convs"]
    ms["draft"] = ms["draft_with_convs"]
    ms["cycle"] = ms["verify"] + ms["draft_with_convs"] + ms["selector"] + ms["context_kv"]
    return ms


def engine_phases(pipe: Pipeline, prompts: list[list[int]], config: GenerationConfig) -> dict:
    totals: dict[str, float] = {}
    cycles = 0
    for ids in tqdm(prompts, desc="engine phases", unit="prompt", leave=False):
        result = pipe.decoder.generate([ids], config)[0]
        cycles += result.stats.cycles
        for phase, seconds in result.timing.phase_seconds.items():
            totals[phase] = totals.get(phase, 0.0) + seconds
    per_cycle = sum(v for k, v in totals.items() if k != "prefill")
    return {"phase_seconds": totals, "cycles": cycles,
            "shares": {k: v / per_cycle for k, v in totals.items() if k != "prefill" and per_cycle}}


def run_analysis(pipe: Pipeline, args: AnalyzeSettings) -> dict:
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    draft = pipe.decoder.draft
    require(draft is not None, "analyze needs a draft")
    print(f"# analyze: {args.model.target_label} | draft {pipe.draft_description} | {pipe.header()}", file=sys.stderr)
    conversations = load_conversations(list(args.datasets), args.num_prompts, list(args.dataset_files))
    prompts = [p for convs in conversations.values() for p in first_turns(convs, pipe.tokenizer)]
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, stop_token_ids=tuple(pipe.stop_token_ids),
                              seed=args.model.seed)
    ar = pipe.decoder.variant(speculate="never")
    sequences = []
    for ids in tqdm(prompts, desc="target greedy continuations", unit="prompt"):
        sequences.append((len(ids), ids + ar.generate([ids], config)[0].tokens))
    positions = draft.config.block_size - 1
    variants = ("convs_on", "convs_off") if draft.config.use_conv else ("convs_on",)
    tallies = {v: Tally(positions) for v in variants}
    probes = {v: AttentionProbe(draft) for v in variants}
    teacher_forced(pipe, sequences, args, tallies, probes)
    on = tallies["convs_on"]
    recall = on.recall()
    if "convs_off" in tallies:
        off = tallies["convs_off"].recall()
        recall.update(top1_convs_off=off["top1"], topk_convs_off=off["topk"])
    shares = {v: probes[v].shares() for v in variants}
    shares.setdefault("convs_off", shares["convs_on"])
    micro = latency(pipe, prompts[0], args.repeats)
    engine = engine_phases(pipe, prompts[: min(4, len(prompts))],
                           GenerationConfig(max_new_tokens=min(64, args.max_new_tokens),
                                            stop_token_ids=tuple(pipe.stop_token_ids), seed=args.model.seed))
    info = machine_info()
    results = {
        "settings": {"target": args.model.target_label,
                     "draft": pipe.draft_description, "trained_draft": pipe.trained_draft,
                     "datasets": list(conversations), "num_prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
                     "top_k": args.top_k, "block_size": draft.config.block_size, "has_convs": draft.config.use_conv,
                     "selector_top_k": draft.selector.top_k if draft.selector is not None else None,
                     "full_blocks": on.full_blocks, "continuation_tokens": sum(len(s) - p for p, s in sequences),
                     "device": args.model.device, **pipe.precision.record(), "seed": args.model.seed},
        "recall": recall,
        "acceptance": {v: tallies[v].acceptance() for v in variants},
        "lattice_tree": on.lattice_tree(),
        "suffix_decay": {"topk_first": recall["topk"][0], "topk_last": recall["topk"][-1],
                         "oracle_reach_last": recall["oracle_reach"][-1]},
        "attention_share": dict(shares, recompute_max_error=max(p.max_error for p in probes.values())),
        "latency": {"microbench_ms": micro, "shares": {"selector": micro["selector"] / micro["cycle"],
                                                       "convs": micro["convs"] / micro["cycle"]},
                    "engine": engine},
        "machine": machine_line(info), "machine_details": info, "commit": git_commit(),
    }
    if draft.selector is None:
        results["notes"] = ["draft has no selector (DFlash v1): the selector column is plain argmax"]
    results["plots"] = plots.analysis_plots(results, out)
    write_json(out / "results.json", results)
    write_text(out / "results.md", render_markdown(results))
    print(f"# wrote {out / 'results.json'}, {out / 'results.md'} and {len(results['plots'])} plots", file=sys.stderr)
    return results


def render_markdown(r: dict) -> str:
    s, k = r["settings"], r["settings"]["top_k"]
    lines = [f"# dflash2 analyze: {s['target']}\n",
             f"- draft: {s['draft']}; datasets {', '.join(s['datasets'])}; {s['num_prompts']} prompts, "
             f"{s['continuation_tokens']} continuation tokens, {s['full_blocks']} full blocks (teacher-forced on "
             f"the target's own greedy output); {s['device']} {s['dtype']}",
             f"- machine: {r['machine']}; commit {r['commit']}\n",
             "## Recall per block position (a, c)\n"]
    rec = r["recall"]
    rows = [["top-1", *rec["top1"]], [f"top-{k}", *rec["topk"]], [f"top-{k} given earlier in top-{k}",
            *rec["topk_given_prefix"]], [f"ideal top-{k} picker reaches k", *rec["oracle_reach"]]]
    if "top1_convs_off" in rec:
        rows += [["top-1, convs off", *rec["top1_convs_off"]], [f"top-{k}, convs off", *rec["topk_convs_off"]]]
    lines.append(markdown_table(["metric"] + [f"k={i}" for i in range(1, len(rec["top1"]) + 1)], rows))
    lines.append(f"Suffix decay: top-{k} recall {rec['topk'][0]:.3f} at position 1 -> {rec['topk'][-1]:.3f} "
                 f"at position {len(rec['topk'])}.\n")
    lines.append("## Acceptance length of full blocks, teacher-forced (b)\n")
    rows = [[v.replace("_", " "), a["argmax"], a["selector"], a["oracle"]] for v, a in r["acceptance"].items()]
    lines.append(markdown_table(["draft", "argmax", "selector (greedy walk)", f"oracle (best path in top-{k})"], rows))
    tree = r.get("lattice_tree")
    if tree and s.get("selector_top_k"):
        lines.append("## The lattice's second path as a tree branch (b')\n")
        lines.append(f"Main path: {s['block_size'] - 1} nodes, tau {r['acceptance']['convs_on']['selector']:.3f}. "
                     "The second path forks where reaching it times its runner-up's probability is highest "
                     "and is cut to at most L nodes past the fork.\n")
        rows = [[cut, t, n] for cut, (t, n) in enumerate(zip(tree["tau"], tree["extra_nodes"]), start=1)]
        lines.append(markdown_table(["L", "tau of the tree", "nodes added (mean)"], rows))
    share = r["attention_share"]
    lines.append("## In-block attention share per draft layer (d)\n")
    rows = [[i + 1, 100 * a, 100 * b] for i, (a, b) in enumerate(zip(share["convs_on"], share["convs_off"]))]
    lines.append(markdown_table(["layer", "convs on (%)", "convs off (%)"], rows))
    lines.append(f"Recomputed attention matches the modules' outputs to {share['recompute_max_error']:.2e} (relative).\n")
    lat = r["latency"]
    lines.append("## Cycle latency (e)\n")
    rows = [[name, value] for name, value in lat["microbench_ms"].items()]
    lines.append(markdown_table(["component (median ms)", "value"], rows))
    eng = lat["engine"]["shares"]
    lines.append(f"Selector share of a cycle: {100 * lat['shares']['selector']:.2f} % (microbench), "
                 f"{100 * eng.get('selector', 0):.2f} % (engine phases); convs: {100 * lat['shares']['convs']:.2f} % "
                 "(draft forward with minus without convs: a difference of two timings, noisy on a shared machine).\n")
    lines += ["## Plots\n"] + [f"![{p}]({p})" for p in r["plots"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    load_conversations(list(args.datasets), args.num_prompts, list(args.dataset_files))  # bad prompt files fail before any load
    run_analysis(build_pipeline(args.model.measuring_the_draft()), args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
