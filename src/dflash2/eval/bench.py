"""`dflash2 bench`: the DFlash2 evaluation protocol (SPEC §5) on this engine, side by side with peers.

Contract: `main(argv)` (and `run_bench(pipe, args)` for a pre-built `Pipeline`) decodes every
prompt of each dataset twice with the SAME engine and batch size: speculatively (target + draft)
and autoregressively (`SpeculativeDecoder(target)`, no draft), batch by batch, interleaved, in
batches of each `--concurrency` value. Datasets: shipped benchmarks (`--datasets`) and/or JSONL
files (`--dataset-file`, repeatable, each its own dataset reported under its stem; checked before
anything loads). Multi-turn conversations (MT-Bench) send turn
k+1 after the target's OWN answer to turn k (the autoregressive answer at the first concurrency).

Per dataset and overall, at every concurrency, it reports:
- acceptance length tau = committed tokens / verification passes (bonus counted, the prefill's
  token excluded); the overall and per-dataset figures pool cycles (total tokens / total cycles,
  not a mean of per-prompt means); `mean_over_datasets` is the plain mean of the dataset figures;
- per-position acceptance (fraction of cycles whose drafts 1..k were all accepted), tau histogram;
- tokens/s (new tokens / wall time incl. prefill), time per output token (wall minus prefill per
  token), speedup = autoregressive TPOT / speculative TPOT, phase times;
- at T=0, `mismatches`: sequences whose speculative output differs from the autoregressive one
  (0 expected in float32); None when sampling.
Every finished dataset and peer group is saved under OUTPUT/parts (`benchparts`); `--resume`
reuses those of an interrupted run with identical settings, weights and code.
`--no-baseline` skips the autoregressive runs (acceptance length and throughput only; speedup and
mismatches are None), e.g. for comparing drafts; MT-Bench's next turn then follows the speculative
answer (a target sample either way; identical to the autoregressive one at T=0).
With `--peers [hf,pld,dflash,vllm,vllm-dflash,mlx-dflash]` it also runs the peers of
`dflash2.eval.peers` / `dflash2.eval.engine_peers` at batch 1.
Writes OUTPUT/results.json, results.md and the PNG plots of `dflash2.eval.plots`.
"""
from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm import tqdm

from dflash2.argparsing import OneLineParser
from dflash2.eval import engine_peers
from dflash2.eval import peers as peer_runs
from dflash2.eval import plots
from dflash2.eval.parts import PartStore, run_fingerprint, weights_digest
from dflash2.eval.benchkit import (add_model_arguments, build_pipeline, check_output, fmt, git_commit,
                                   load_conversations, machine_identity, machine_info, machine_line, markdown_table,
                                   parse_list, write_json, write_text)
from dflash2.targets.chat import encode_messages
from dflash2.decoding.engine import GenerationConfig, SpeculativeDecoder
from dflash2.decoding.stats import BatchTiming, RowStats
from dflash2.errors import DFlash2Error, require
from dflash2.pipeline import Pipeline, shipped_draft_path
from dflash2.data.prompts import BENCHMARKS

DEFINITIONS = {
    "acceptance_length": "committed tokens / verification passes, bonus token counted, prefill token excluded; "
                         "pooled over all cycles (total tokens / total cycles), not a mean of per-prompt means",
    "tokens_per_second": "new tokens / wall seconds of the generate() calls, prefill included",
    "time_per_output_token_ms": "(wall - prefill) / new tokens",
    "speedup": "autoregressive time per output token / speculative time per output token, same engine, "
               "same prompts, same batch size",
    "mismatches": "sequences whose speculative output differs from the autoregressive output (T=0 only)",
    "position_acceptance": "fraction of cycles in which drafts 1..k were all accepted",
    "drafts_verified_per_cycle": "draft tokens the target verified per speculative cycle (the adaptive length)",
    "plain_steps": "one-token target steps without a draft pass (fallback when drafting does not pay)",
    "fallback_seconds": "wall time of the batches' plain steps",
}


@dataclass
class Side:
    """One decoder's runs over a list of prompts at one batch size: per-row counts and outputs,
    and the batches' timing (each `generate` call is one batch)."""
    outputs: list[list[int]] = field(default_factory=list)
    stats: list[RowStats] = field(default_factory=list)
    batches: list[BatchTiming] = field(default_factory=list)
    seconds: float = 0.0

    def add(self, results, seconds: float) -> None:
        self.outputs += [r.tokens for r in results]
        self.stats += [r.stats for r in results]
        self.batches.append(results[0].timing)  # every row of a generate() call carries its batch's timing
        self.seconds += seconds

    @property
    def prefill(self) -> float:
        return sum(t.prefill_seconds for t in self.batches)

    @property
    def phases(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for timing in self.batches:
            for phase, value in timing.phase_seconds.items():
                out[phase] = out.get(phase, 0.0) + value
        return out

    def to_dict(self) -> dict:
        return {"outputs": self.outputs, "stats": [st.to_dict() for st in self.stats],
                "batches": [t.to_dict() for t in self.batches], "seconds": self.seconds}

    @classmethod
    def from_dict(cls, data: dict) -> "Side":
        return cls(data["outputs"], [RowStats.from_dict(st) for st in data["stats"]],
                   [BatchTiming.from_dict(t) for t in data["batches"]], data["seconds"])


def parse_args(argv):
    p = OneLineParser(prog="dflash2 bench", description="Acceptance length, speedup and losslessness of "
                                "speculative decoding vs this engine's autoregressive baseline, and vs peers.")
    add_model_arguments(p)
    p.add_argument("--datasets", default=None, help=f"comma list of {', '.join(BENCHMARKS)} (default: all, or none "
                                                    "when --dataset-file is given)")
    p.add_argument("--dataset-file", action="append", default=None,
                   help="JSONL prompts ({prompt} or {turns} per line), its own dataset (repeat for several)")
    p.add_argument("--num-prompts", type=int, default=16, help="first N prompts of each dataset")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (official: 1.0)")
    p.add_argument("--top-p", type=float, default=1.0, help="official: 0.95")
    p.add_argument("--top-k", type=int, default=0, help="official: 20")
    p.add_argument("--no-baseline", action="store_true", help="skip the autoregressive runs: acceptance length and "
                   "throughput only (no speedup, no lossless check); the next MT-Bench turn follows the speculative answer")
    p.add_argument("--resume", action="store_true", help="reuse the finished parts (datasets, peer groups) of an "
                   "interrupted run in --output with identical settings, weights and code")
    p.add_argument("--concurrency", default="1", help="comma list of batch sizes, e.g. 1,8,32")
    p.add_argument("--output", default="runs/bench", help="directory for results.json, results.md and plots")
    p.add_argument("--peers", nargs="?", const="all", default=None,
                   help="also run peers: all (default) or a comma list of hf, pld, dflash, vllm, vllm-dflash, "
                        "mlx-dflash")
    p.add_argument("--peers-python", default=None, help="python of the peers venv (default .venv-peers/bin/python)")
    args = p.parse_args(argv)
    require(args.num_prompts > 0, f"--num-prompts must be positive, got {args.num_prompts}")
    GenerationConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                     top_k=args.top_k, seed=args.seed).validate()
    check_output(args.output)
    args.concurrency_list = [int(c) for c in parse_list(args.concurrency, "--concurrency") if c.isdigit() and int(c) > 0]
    require(len(args.concurrency_list) == len(parse_list(args.concurrency, "--concurrency")),
            f"--concurrency must be positive integers, got '{args.concurrency}'")
    if args.datasets is None:
        args.dataset_list = [] if args.dataset_file else list(BENCHMARKS)
    else:
        args.dataset_list = [] if args.datasets.strip().lower() in ("", "none") else parse_list(args.datasets, "--datasets")
    if args.peers is None:
        args.peer_set = set()
    else:
        args.peer_set = set(peer_runs.PEER_NAMES) if args.peers == "all" else set(parse_list(args.peers, "--peers"))
        unknown = sorted(args.peer_set - set(peer_runs.PEER_NAMES))
        if unknown:
            raise DFlash2Error(f"unknown peer '{unknown[0]}' (choose from {', '.join(peer_runs.PEER_NAMES)})")
    return args


def run_pair(ar: SpeculativeDecoder, spec: SpeculativeDecoder, prompts, batch: int, config, desc: str):
    """Decode `prompts` in batches with both decoders, batch by batch, so load drift hits both alike."""
    sides = Side(), Side()
    for start in tqdm(range(0, len(prompts), batch), desc=desc, unit="batch", leave=False):
        chunk = prompts[start:start + batch]
        for decoder, side in zip((ar, spec), sides):
            if decoder is None:  # --no-baseline
                continue
            clock = time.perf_counter()
            results = decoder.generate(chunk, config)
            side.add(results, time.perf_counter() - clock)
    return sides


def summarize(sides: list[Side], block: int) -> dict:
    stats = [s for side in sides for s in side.stats]
    batches = [t for side in sides for t in side.batches]
    cycles = sum(s.cycles for s in stats)
    committed = sum(sum(s.committed_per_cycle) for s in stats)
    tokens = sum(s.new_tokens for s in stats)
    seconds, prefill = sum(x.seconds for x in sides), sum(x.prefill for x in sides)
    phases: dict[str, float] = {}
    for side in sides:
        for phase, value in side.phases.items():
            phases[phase] = phases.get(phase, 0.0) + value
    verified = sum(sum(s.drafts_per_cycle) for s in stats)
    lengths: dict[int, int] = {}
    for s in stats:
        for k in s.drafts_per_cycle:
            lengths[k] = lengths.get(k, 0) + 1
    return {
        "acceptance_length": committed / cycles if cycles else None, "cycles": cycles, "new_tokens": tokens,
        "sequences": len(stats), "seconds": seconds, "prefill_seconds": prefill,
        "tokens_per_second": tokens / seconds if seconds else None,
        "time_per_output_token_ms": 1000 * (seconds - prefill) / tokens if tokens else None,
        "position_acceptance": [sum(s.accepted_at_position[k] for s in stats) / cycles if cycles else 0.0
                                for k in range(block - 1)],
        "histogram": {tau: sum(s.committed_per_cycle.count(tau) for s in stats) for tau in range(1, block + 1)},
        "drafts_verified_per_cycle": verified / cycles if cycles else None,
        "draft_lengths": dict(sorted(lengths.items())),
        "plain_steps": sum(s.plain_steps for s in stats),
        "fallback_seconds": sum(t.plain_seconds for t in batches),
        "phase_seconds": phases,
    }


def entry(ar_sides: list[Side], spec_sides: list[Side], block: int, greedy: bool) -> dict:
    spec, ar = summarize(spec_sides, block), summarize(ar_sides, 1)
    if not ar["sequences"]:  # --no-baseline
        ar["time_per_output_token_ms"] = None
        greedy = False
    pairs = [(a, s) for ar_side, spec_side in zip(ar_sides, spec_sides)
             for a, s in zip(ar_side.outputs, spec_side.outputs)]
    out = dict(spec)
    out.update(speedup=(ar["time_per_output_token_ms"] / spec["time_per_output_token_ms"]
                        if spec["time_per_output_token_ms"] and ar["time_per_output_token_ms"] else None),
               baseline_tokens_per_second=ar["tokens_per_second"],
               baseline_time_per_output_token_ms=ar["time_per_output_token_ms"],
               baseline_seconds=ar["seconds"],
               mismatches=sum(a != s for a, s in pairs) if greedy else None, compared=len(pairs))
    return out


def bench_dataset(pipe: Pipeline, ar: SpeculativeDecoder, name: str, conversations, config, concurrency):
    """-> ({concurrency: (ar sides, spec sides)}, prompts in run order, AR outputs at the first concurrency,
    per-cycle acceptance lengths of the speculative runs at the first concurrency)."""
    runs = {c: ([], []) for c in concurrency}
    histories: list[list[dict]] = [[] for _ in conversations]
    all_prompts, first_outputs, first_cycles = [], [], []
    for turn in range(max(len(c.turns) for c in conversations)):
        active = [i for i, conv in enumerate(conversations) if turn < len(conv.turns)]
        prompts = []
        for i in active:
            histories[i].append({"role": "user", "content": conversations[i].turns[turn]})
            prompts.append(encode_messages(pipe.tokenizer, histories[i]))
        for c in concurrency:
            ar_side, spec_side = run_pair(ar, pipe.decoder, prompts, c, config, f"{name} turn {turn + 1} c={c}")
            runs[c][0].append(ar_side)
            runs[c][1].append(spec_side)
        answers = runs[concurrency[0]][0 if ar is not None else 1][-1].outputs
        for i, answer in zip(active, answers):  # the next turn continues with the target's own answer
            histories[i].append({"role": "assistant", "content": pipe.tokenizer.decode(answer, skip_special_tokens=True)})
        all_prompts += prompts
        first_outputs += answers
        first_cycles += [st.committed_per_cycle for st in runs[concurrency[0]][1][-1].stats]
    return runs, all_prompts, first_outputs, first_cycles


def peer_model_dirs(pipe: Pipeline, args, out: Path) -> tuple[str | None, str | None]:
    """Directories of the target and the draft checkpoint that the reference package should load."""
    from dflash2.targets.builtin import BUILTIN_TARGETS, resolve_target

    if getattr(args, "tiny", False):
        target_dir = out / "peer-models" / "tiny-target"
        pipe.decoder.target.model.save_pretrained(target_dir)
    else:
        resolved = resolve_target(args.target)
        target_dir = Path(resolved) if Path(resolved).is_dir() else None
    if args.draft:
        return (str(target_dir) if target_dir else None), args.draft
    shipped = shipped_draft_path(args.target) if args.target in BUILTIN_TARGETS and not args.tiny else None
    if shipped is not None:
        return (str(target_dir) if target_dir else None), str(shipped)
    draft_dir = out / "peer-models" / "draft-in-use"  # the untrained / tiny draft this run used
    pipe.decoder.draft.save_pretrained(draft_dir)
    return (str(target_dir) if target_dir else None), str(draft_dir)


def run_peers(pipe: Pipeline, args, config, prompts, ar_outputs, out: Path, block: int, store: PartStore) -> dict:
    """The peers in two resumable groups: Hugging Face (generate, prompt lookup) and the reference."""
    reports = {}
    greedy_refs = ar_outputs if config.temperature <= 0 else None
    if args.peer_set & {"hf", "pld"}:
        group = store.load("peers-hf")
        if group is None:
            pad = getattr(pipe.tokenizer, "pad_token_id", None)
            group = peer_runs.hf_peers(pipe.decoder.target.model, prompts, greedy_refs, config, pipe.stop_token_ids,
                                       0 if pad is None else pad, block, args.peer_set)
            store.save("peers-hf", group)
        reports.update(group)
    if "dflash" in args.peer_set:
        report = store.load("peers-dflash")
        if report is None:
            print("# peers: running PyPI dflash 0.1.0 in its own venv (batch 1)", file=sys.stderr)
            target_dir, draft_dir = peer_model_dirs(pipe, args, out)
            report = peer_runs.dflash_reference(args.peers_python, target_dir, draft_dir, prompts, greedy_refs,
                                                config, pipe.stop_token_ids, args.device, args.dtype)
            if report.get("status") == "ok":  # an unavailable peer is retried on --resume
                store.save("peers-dflash", report)
        reports["dflash_reference"] = report
    for spec in engine_peers.ENGINE_PEERS:  # vLLM CPU, MLX dflash: each in its own venv
        if spec.short in args.peer_set:
            report = store.load(f"peers-{spec.short}")
            if report is None:
                target_dir, draft_dir = peer_model_dirs(pipe, args, out)
                report = engine_peers.engine_peer(spec, None, target_dir, draft_dir, prompts, greedy_refs, config,
                                                  pipe.stop_token_ids, out / "peer-models")
                if report.get("status") == "ok":
                    store.save(f"peers-{spec.short}", report)
            reports[spec.key] = report
    return reports


def dataset_runs(store: PartStore, pipe: Pipeline, ar, name: str, convs, config, concurrency):
    """`bench_dataset`, or its saved part when resuming."""
    part = store.load(f"dataset-{name}")
    if part is not None:
        runs = {int(c): tuple([Side.from_dict(x) for x in group] for group in pair)
                for c, pair in part["runs"].items()}
        return runs, part["prompts"], part["outputs"], part["cycles"]
    runs, prompts, outputs, cycles = bench_dataset(pipe, ar, name, convs, config, concurrency)
    store.save(f"dataset-{name}", {
        "runs": {str(c): [[side.to_dict() for side in group] for group in pair] for c, pair in runs.items()},
        "prompts": prompts, "outputs": outputs, "cycles": cycles})
    return runs, prompts, outputs, cycles


def compare_cycles(reference: dict, our_cycles: dict[str, list[list[int]]], comparable: bool) -> None:
    """Count sequences whose per-cycle acceptance lengths equal dflash2's (greedy, batch 1 only)."""
    if reference.get("status") != "ok":
        return
    theirs = [c for name in our_cycles for c in reference["datasets"][name].pop("per_sequence_cycles")]
    if comparable:
        ours = [c for name in our_cycles for c in our_cycles[name]]
        reference["same_cycles_as_dflash2"] = sum(a == b for a, b in zip(ours, theirs))
        reference["notes"].append(f"{reference['same_cycles_as_dflash2']} of {len(ours)} sequences have exactly "
                                  "dflash2's per-cycle acceptance lengths (same draft, batch 1)")


def run_bench(pipe: Pipeline, args) -> dict:
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    require(pipe.decoder.draft is not None, "bench needs a draft (the autoregressive baseline is built from the target)")
    conversations = load_conversations(args.dataset_list, args.num_prompts, args.dataset_file)
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                              top_k=args.top_k, stop_token_ids=tuple(pipe.stop_token_ids), seed=args.seed)
    config.validate()
    greedy = config.temperature <= 0
    ar = None if getattr(args, "no_baseline", False) else SpeculativeDecoder(pipe.decoder.target)
    block = pipe.decoder.block_size(config)
    concurrency = args.concurrency_list
    settings = {"target": "tiny random llama" if getattr(args, "tiny", False) else args.target,
                "draft": pipe.draft_description, "trained_draft": pipe.trained_draft, "block_size": block,
                "speculate": pipe.decoder.speculate,
                "datasets": list(conversations), "num_prompts": args.num_prompts,
                "max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "top_p": args.top_p,
                "top_k": args.top_k, "concurrency": concurrency, "device": args.device, "dtype": args.dtype,
                "seed": args.seed, "peers": sorted(args.peer_set), "baseline": ar is not None,
                "dataset_file": args.dataset_file, "machine": machine_identity()}
    weights = weights_digest(pipe.decoder.target.model, pipe.decoder.draft)
    store = PartStore(out, run_fingerprint(settings, weights, Path(__file__).resolve().parent),
                      getattr(args, "resume", False))
    print(f"# bench: draft {pipe.draft_description}; block {block}; concurrency {concurrency}", file=sys.stderr)
    warm = first_prompt(pipe, conversations)
    for decoder in (ar, pipe.decoder):  # untimed warm-up: first-call overheads hit neither side's figures
        if decoder is not None:
            decoder.generate([warm], GenerationConfig(max_new_tokens=min(8, args.max_new_tokens), seed=args.seed))

    datasets, all_runs, peer_prompts, peer_refs, our_cycles = {}, {c: ([], []) for c in concurrency}, {}, {}, {}
    for name, convs in conversations.items():
        runs, prompts, outputs, cycles = dataset_runs(store, pipe, ar, name, convs, config, concurrency)
        per_c = {}
        for c in concurrency:
            per_c[str(c)] = entry(runs[c][0], runs[c][1], block, greedy)
            all_runs[c][0].extend(runs[c][0])
            all_runs[c][1].extend(runs[c][1])
        datasets[name] = dict(per_c[str(concurrency[0])], num_prompts=len(convs), by_concurrency=per_c)
        peer_prompts[name], peer_refs[name], our_cycles[name] = prompts, outputs, cycles
        print(f"# {name}: tau {fmt(datasets[name]['acceptance_length'])}, speedup {fmt(datasets[name]['speedup'])}x, "
              f"mismatches {datasets[name]['mismatches']}", file=sys.stderr)
    overall_c = {str(c): entry(all_runs[c][0], all_runs[c][1], block, greedy) for c in concurrency}
    overall = dict(overall_c[str(concurrency[0])], by_concurrency=overall_c,
                   mean_over_datasets=sum(d["acceptance_length"] or 0 for d in datasets.values()) / len(datasets))
    peers = run_peers(pipe, args, config, peer_prompts, peer_refs, out, block, store) if args.peer_set else {}
    if "dflash_reference" in peers:
        compare_cycles(peers["dflash_reference"], our_cycles, concurrency[0] == 1 and greedy)
    info = machine_info()
    results = {
        "settings": dict(settings, definitions=DEFINITIONS, weights_sha256=weights, resumed_parts=store.reused),
        "datasets": datasets, "overall": overall, "peers": peers,
        "machine": machine_line(info), "machine_details": info, "commit": git_commit(),
    }
    results["plots"] = plots.bench_plots(results, out)
    write_json(out / "results.json", results)
    write_text(out / "results.md", render_markdown(results))
    print(f"# wrote {out / 'results.json'}, {out / 'results.md'} and {len(results['plots'])} plots", file=sys.stderr)
    return results


def first_prompt(pipe: Pipeline, conversations) -> list[int]:
    conv = next(iter(conversations.values()))[0]
    return encode_messages(pipe.tokenizer, [{"role": "user", "content": conv.turns[0]}])


def render_markdown(results: dict) -> str:
    s = results["settings"]
    c0 = s["concurrency"][0]
    lines = [f"# dflash2 bench: {s['target']}\n",
             f"- draft: {s['draft']}{'' if s['trained_draft'] else ' (untrained: expect tau near 1)'}",
             f"- {len(s['datasets'])} datasets, {s['num_prompts']} prompts each, max {s['max_new_tokens']} new tokens, "
             f"T={s['temperature']}, top-p {s['top_p']}, top-k {s['top_k']}, block {s['block_size']}, "
             f"{s['device']} {s['dtype']}, seed {s['seed']}",
             f"- machine: {results['machine']}; commit {results['commit']}",
             "- acceptance length (tau) = committed tokens / verification passes (bonus counted); the overall row pools "
             "every cycle of every dataset (total tokens / total cycles), it is not a mean of means; speedup = "
             "autoregressive / speculative time per output token of this same engine, same prompts and batch size\n",
             f"## dflash2 at concurrency {c0}\n"]
    rows = [[name, d["acceptance_length"], d["baseline_tokens_per_second"], d["tokens_per_second"], d["speedup"],
             d["time_per_output_token_ms"], d["mismatches"], d["sequences"]]
            for name, d in list(results["datasets"].items()) + [("**overall**", results["overall"])]]
    lines.append(markdown_table(["dataset", "tau", "AR tok/s", "spec tok/s", "speedup", "TPOT ms", "mismatches",
                                 "sequences"], rows))
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
                 d["mismatches"]] for c, d in results["overall"]["by_concurrency"].items()]
        lines.append(markdown_table(["batch", "tau", "AR tok/s", "spec tok/s", "speedup", "mismatches"], rows))
    if results["peers"]:
        lines.append(render_peers(results))
    lines.append("## Plots\n")
    lines += [f"![{p}]({p})" for p in results["plots"]]
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
            rows.append([key, name, d.get("acceptance_length"), d.get("tokens_per_second"), d.get("speedup"),
                         d.get("mismatches")])
    lines.append(markdown_table(["decoder", "dataset", "tau", "tok/s", "speedup", "mismatches vs dflash2 AR"], rows))
    for key, report in results["peers"].items():
        status = report["status"] + (f": {report['reason']}" if report.get("reason") else "")
        lines.append(f"- **{key}** ({report['description']}): {status}")
        lines += [f"  - {note}" for note in report.get("notes", [])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    load_conversations(args.dataset_list, args.num_prompts, args.dataset_file)  # bad prompt files fail before any load
    run_bench(build_pipeline(args), args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
