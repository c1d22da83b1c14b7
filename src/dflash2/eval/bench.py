"""`dflash2 bench`: the DFlash2 evaluation protocol (docs/spec.md §5) on this engine, side by side with peers.

Contract: `main(argv)` (and `run_bench(pipe, settings: BenchSettings)` for a pre-built `Pipeline`;
`parse_args(argv)` builds the settings, other code such as the ablation builds them directly) decodes every
prompt of each dataset with the SAME engine and batch size: speculatively (target + draft) and
autoregressively (the decoder's plain `variant`, no draft), batch by batch, interleaved, in
batches of each `--concurrency` value. `--proposer draft,lookup,hybrid` measures several proposers
side by side in one run: each its own decoder over the same target and draft
(`Pipeline.decoder_for`), all decoded in turn batch by batch beside ONE autoregressive baseline
(which decoder goes first rotates); `results["proposers"]` holds each one's report, and the
top-level `datasets` / `overall` are the first one's. Datasets: shipped benchmarks (`--datasets`) and/or JSONL
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
  (0 expected in float32, and at any precision with `--exact-verify`); None when sampling; and
  the lossless audit of each (`eval.float32_reference`, `eval.audit`): `near_ties` (the float32
  target's margin between the two tokens at the first divergence within the precision's
  near-tie bound), `defects` (above it: a decoder fault) and `worst_margin`.
The target runs at `--dtype` (default `auto`: bfloat16 where the device computes it natively,
`devices.resolve_precision`), recorded in the settings with why; the autoregressive baseline and
the Hugging Face peers run at that same precision. Below float32 the plain decoder of the float32
target is a reference row beside the peers (batch 1, `--no-reference` skips it). With `--weights
int8|int4` the target is the quantized one throughout (plain decoding included), its float32
reference is those quantized weights dequantized, and `--peers` (float weights) is refused.
Runs are typed (`eval.bench_runs`): a `Side` is one decoder's runs at one batch size, a `PairRuns`
one proposer's and the baseline's sides turn by turn, a `DatasetRun` a dataset's pairs at every
concurrency for every proposer.
`--repeats N` decodes the prompt list N times (which decoder goes first alternating batch by
batch) for `speedup_median`, the median of paired batch ratios. Every finished dataset and peer group is saved
under OUTPUT/parts (`eval.parts`); `--resume`
reuses those of an interrupted run with identical settings, weights and code.
`--no-baseline` skips the autoregressive runs (acceptance length and throughput only; speedup and
mismatches are None), e.g. for comparing drafts; MT-Bench's next turn then follows the speculative
answer (a target sample either way; identical to the autoregressive one at T=0).
With `--peers [hf,pld,dflash,vllm,vllm-dflash,mlx-dflash,llama-cpp,llama-cpp-dflash]` it also runs the
peers of `dflash2.eval.peers` / `engine_peers` / `llama_peers` at batch 1 (llama.cpp: `--llama-cpp
DIR`, `--llama-threads N`, default `--threads`, else torch's thread count).
Writes OUTPUT/results.json, results.md and the PNG plots of `dflash2.eval.plots`.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from dflash2.argparsing import ModelSettings, OneLineParser, add_model_arguments, parse_list
from dflash2.data.prompts import BENCHMARKS, PROJECT_SETS, load_conversations
from dflash2.decoding.loop.engine import GenerationConfig, SpeculativeDecoder
from dflash2.decoding.proposers.kinds import PROPOSERS
from dflash2.errors import DFlash2Error, require
from dflash2.eval import engine_peers, float32_reference, llama_peers
from dflash2.eval import peers as peer_runs
from dflash2.eval.audit import reference_loader
from dflash2.eval import plots
from dflash2.eval.bench_report import render_markdown
from dflash2.eval.bench_runs import DEFINITIONS, DatasetRun, PairRuns, Side, entry
from dflash2.eval.parts import PartStore, run_fingerprint, weights_digest
from dflash2.export.llama_cpp import ENV as LLAMA_CPP_ENV, find_llama_cpp
from dflash2.files.atomic import check_output, fmt, write_json, write_text
from dflash2.pipeline import Pipeline, build_pipeline, shipped_draft_path
from dflash2.runtime.machine import warn_if_busy
from dflash2.runtime.provenance import cpu_ticks, git_commit, machine_identity, machine_info, machine_line, steal_share
from dflash2.targets.builtin import BUILTIN_TARGETS, load_target_model, open_target, resolve_target
from dflash2.targets.chat import encode_messages
from dflash2.targets.grouped_attention import stock_attention

PEER_NAMES = peer_runs.PEER_NAMES + engine_peers.ENGINE_PEER_NAMES + llama_peers.LLAMA_PEER_NAMES   # --peers

@dataclass(frozen=True)
class BenchSettings:
    """Everything a bench run depends on besides the code and the weights."""
    model: ModelSettings = field(default_factory=ModelSettings)
    datasets: tuple[str, ...] = tuple(BENCHMARKS)
    dataset_files: tuple[str, ...] = ()
    num_prompts: int = 16
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    baseline: bool = True            # False: no autoregressive runs (no speedup, no lossless check)
    resume: bool = False
    concurrency: tuple[int, ...] = (1,)
    repeats: int = 1                 # each batch decoded this many times by each decoder, in turn
    output: str = "runs/bench"
    peers: frozenset[str] = frozenset()
    peers_python: str | None = None
    proposers: tuple[str, ...] = ()  # measured side by side, in this order; empty: the pipeline's own
    reference: bool = True           # a reduced-precision run also decodes the float32 target plainly (a row)
    llama_cpp: str | None = None     # llama.cpp's directory (llama peers); None: `find_llama_cpp`'s search
    llama_threads: int | None = None  # llama.cpp's threads; None: the model's --threads, else torch's

    def generation(self, stop_token_ids=()) -> GenerationConfig:
        return GenerationConfig(max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p,
                                top_k=self.top_k, stop_token_ids=tuple(stop_token_ids), seed=self.model.seed)

    def validate(self) -> "BenchSettings":
        require(self.num_prompts > 0, f"--num-prompts must be positive, got {self.num_prompts}")
        require(self.repeats > 0, f"--repeats must be positive, got {self.repeats}")
        self.generation().validate()
        check_output(self.output)
        require(bool(self.concurrency) and all(c > 0 for c in self.concurrency),
                f"--concurrency must be positive integers, got {list(self.concurrency)}")
        unknown = sorted(self.peers - set(PEER_NAMES))
        if unknown:
            raise DFlash2Error(f"unknown peer '{unknown[0]}' (choose from {', '.join(PEER_NAMES)})")
        require(not (self.peers and self.model.weights != "float"),
                f"--peers run the target's float weights, and --weights {self.model.weights} benchmarks a quantized "
                "target; drop one of them")
        require(self.llama_threads is None or self.llama_threads > 0,
                f"--llama-threads must be a positive integer, got {self.llama_threads}")
        if self.llama_cpp and self.peers & set(llama_peers.LLAMA_PEER_NAMES):
            find_llama_cpp(self.llama_cpp)   # a wrong directory: refused before any load
        return self


def parse_args(argv) -> BenchSettings:
    p = OneLineParser(prog="dflash2 bench", description="Acceptance length, speedup and losslessness of "
                                "speculative decoding vs this engine's autoregressive baseline, and vs peers.")
    add_model_arguments(p, several_proposers=True)
    p.add_argument("--datasets", default=None, help=f"comma list of {', '.join(BENCHMARKS)} and the project's own sets "
                                                    f"{', '.join(PROJECT_SETS)} (default: the five benchmarks, or none "
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
    p.add_argument("--repeats", type=int, default=1, help="decode every batch N times with each decoder, in turn "
                   "(speedup_median: the median of the paired ratios, for noisy machines)")
    p.add_argument("--output", default="runs/bench", help="directory for results.json, results.md and plots")
    p.add_argument("--peers", nargs="?", const="all", default=None,
                   help="also run peers: all (default) or a comma list of " + ", ".join(PEER_NAMES))
    p.add_argument("--peers-python", default=None, help="python of the peers venv (default .venv-peers/bin/python)")
    p.add_argument("--llama-cpp", default=None, help="directory of llama.cpp's programs (llama peers; default: "
                   f"${LLAMA_CPP_ENV}, PATH, or the scripts' .engines install)")
    p.add_argument("--llama-threads", type=int, default=None, help="llama.cpp's threads (default: --threads)")
    p.add_argument("--no-reference", action="store_true", help="below float32, skip the float32 plain decoder's "
                   "reference row (the lossless audit still loads the float32 target if a sequence differs)")
    args = p.parse_args(argv)
    proposers = parse_proposers(args.proposer)
    args.proposer = loading_proposer(proposers)
    items = parse_list(args.concurrency, "--concurrency")
    require(all(c.isdigit() and int(c) > 0 for c in items), f"--concurrency must be positive integers, got '{args.concurrency}'")
    if args.datasets is None:
        datasets = [] if args.dataset_file else list(BENCHMARKS)
    else:
        datasets = [] if args.datasets.strip().lower() in ("", "none") else parse_list(args.datasets, "--datasets")
    peers = (set() if args.peers is None else
             set(PEER_NAMES) if args.peers == "all" else set(parse_list(args.peers, "--peers")))
    return BenchSettings(ModelSettings.from_args(args), tuple(datasets), tuple(args.dataset_file or ()),
                         args.num_prompts, args.max_new_tokens, args.temperature, args.top_p, args.top_k,
                         not args.no_baseline, args.resume, tuple(int(c) for c in items), args.repeats, args.output,
                         frozenset(peers), args.peers_python, proposers, not args.no_reference, args.llama_cpp,
                         args.llama_threads).validate()


def parse_proposers(text: str | None) -> tuple[str, ...]:
    """`--proposer` of bench: one proposer or a comma list, each once."""
    if text is None:
        return ()
    names = parse_list(text, "--proposer")
    for name in names:
        require(name in PROPOSERS, f"--proposer: unknown proposer '{name}' (choose from {', '.join(PROPOSERS)})")
    require(len(set(names)) == len(names), f"--proposer names a proposer twice: '{text}'")
    return tuple(names)


def loading_proposer(proposers: tuple[str, ...]) -> str | None:
    """The proposer the pipeline loads for: the first that needs the draft (the others are built
    over the same target and draft), else lookup; None: the pipeline's default."""
    if not proposers:
        return None
    return next((p for p in proposers if p != "lookup"), "lookup")


def run_sides(ar: SpeculativeDecoder | None, decoders: dict[str, SpeculativeDecoder], prompts, batch: int,
              config, desc: str, repeats: int = 1) -> tuple[Side, dict[str, Side]]:
    """Decode `prompts` in batches with the autoregressive decoder and every proposer's, batch by batch,
    the decoders in turn (which goes first rotates from batch to batch), so load drift and whatever
    the first of a round pays for hit all alike; the whole list `repeats` times (a side's first
    len(prompts) outputs are the first pass, in prompt order) -> (autoregressive side, {proposer:
    side}); the first stays empty when `ar` is None (no baseline)."""
    ar_side, sides = Side(), {name: Side() for name in decoders}
    lineup = ([(ar, ar_side)] if ar is not None else []) + [(decoders[name], sides[name]) for name in decoders]
    chunks = [prompts[start:start + batch] for _ in range(repeats) for start in range(0, len(prompts), batch)]
    for index, chunk in enumerate(tqdm(chunks, desc=desc, unit="batch", leave=False)):
        turn = index % len(lineup)
        for decoder, side in lineup[turn:] + lineup[:turn]:
            clock = time.perf_counter()
            results = decoder.generate(chunk, config)
            side.add(results, time.perf_counter() - clock)
    return ar_side, sides


def bench_dataset(pipe: Pipeline, ar: SpeculativeDecoder | None, decoders: dict[str, SpeculativeDecoder], name: str,
                  conversations, config, concurrency: tuple[int, ...], repeats: int = 1) -> DatasetRun:
    """Every turn of every conversation at every concurrency with every proposer (turn k+1 follows the
    answer to turn k: the autoregressive one, or the first proposer's without a baseline)."""
    ar_runs = {c: [] for c in concurrency}
    runs = {p: {c: PairRuns(ar_runs[c]) for c in concurrency} for p in decoders}
    histories: list[list[dict]] = [[] for _ in conversations]
    all_prompts, first_outputs, first_cycles = [], [], {p: [] for p in decoders}
    for turn in range(max(len(c.turns) for c in conversations)):
        active = [i for i, conv in enumerate(conversations) if turn < len(conv.turns)]
        prompts = []
        for i in active:
            histories[i].append({"role": "user", "content": conversations[i].turns[turn]})
            prompts.append(encode_messages(pipe.tokenizer, histories[i]))
        for c in concurrency:
            ar_side, sides = run_sides(ar, decoders, prompts, c, config, f"{name} turn {turn + 1} c={c}", repeats)
            ar_runs[c].append(ar_side)
            for p, side in sides.items():
                runs[p][c].spec.append(side)
        c0, lead = concurrency[0], next(iter(decoders))
        answers = (ar_runs[c0] if ar is not None else runs[lead][c0].spec)[-1].outputs[:len(prompts)]
        for i, answer in zip(active, answers):  # the next turn continues with the target's own answer
            histories[i].append({"role": "assistant", "content": pipe.tokenizer.decode(answer, skip_special_tokens=True)})
        all_prompts += prompts
        first_outputs += answers
        for p in decoders:
            first_cycles[p] += [st.committed_per_cycle for st in runs[p][c0].spec[-1].stats[:len(prompts)]]
    return DatasetRun(runs, all_prompts, first_outputs, first_cycles)


def peer_model_dirs(pipe: Pipeline, model: ModelSettings, out: Path) -> tuple[str | None, str | None]:
    """Directories of the target and the draft checkpoint that the reference package should load."""
    if model.tiny:
        target_dir = out / "peer-models" / "tiny-target"
        pipe.decoder.target.model.save_pretrained(target_dir)
    else:
        resolved = resolve_target(model.target)
        target_dir = Path(resolved) if Path(resolved).is_dir() else None
    if model.draft:
        return (str(target_dir) if target_dir else None), model.draft
    shipped = shipped_draft_path(model.target) if model.target in BUILTIN_TARGETS and not model.tiny else None
    if shipped is not None:
        return (str(target_dir) if target_dir else None), str(shipped)
    draft_dir = out / "peer-models" / "draft-in-use"  # the untrained / tiny draft this run used
    pipe.decoder.draft.save_pretrained(draft_dir)
    return (str(target_dir) if target_dir else None), str(draft_dir)


def hf_model(pipe: Pipeline, model: ModelSettings):
    """The target in transformers' classes, for Hugging Face `generate()`: the pipeline's own model
    when it is one, else the same weights loaded through transformers (dflash2's own Llama has no
    `generate`)."""
    own = pipe.decoder.target.model
    if hasattr(own, "generate"):
        return own
    return load_target_model(open_target(model.target, "transformers"), pipe.device, pipe.precision.torch_dtype)


def run_peers(pipe: Pipeline, settings: BenchSettings, config, prompts, ar_outputs, out: Path, block: int, store: PartStore) -> dict:
    """The peers in two resumable groups: Hugging Face (generate, prompt lookup) and the reference."""
    reports = {}
    greedy_refs = ar_outputs if config.temperature <= 0 else None
    wanted = settings.peers
    if wanted & {"hf", "pld"}:
        group = store.load("peers-hf")
        if group is None:
            pad = getattr(pipe.tokenizer, "pad_token_id", None)
            with stock_attention(hf_model(pipe, settings.model)) as hf:  # Hugging Face's own kernels
                group = peer_runs.hf_peers(hf, prompts, greedy_refs, config, pipe.stop_token_ids,
                                           0 if pad is None else pad, block, set(wanted))
                ran_at = str(next(hf.parameters()).dtype).removeprefix("torch.")
            for report in group.values():   # the precision they ran at: the benchmarked one
                report["dtype"] = ran_at
            store.save("peers-hf", group)
        reports.update(group)
    if "dflash" in wanted:
        report = store.load("peers-dflash")
        if report is None:
            print("# peers: running PyPI dflash 0.1.0 in its own venv (batch 1)", file=sys.stderr)
            target_dir, draft_dir = peer_model_dirs(pipe, settings.model, out)
            report = peer_runs.dflash_reference(settings.peers_python, target_dir, draft_dir, prompts, greedy_refs,
                                                config, pipe.stop_token_ids, pipe.device, pipe.precision.name)
            if report.get("status") == "ok":  # an unavailable peer is retried on --resume
                store.save("peers-dflash", report)
        reports["dflash_reference"] = report
    for spec in engine_peers.ENGINE_PEERS:  # vLLM CPU, MLX dflash: each in its own venv
        if spec.short in wanted:
            report = store.load(f"peers-{spec.short}")
            if report is None:
                target_dir, draft_dir = peer_model_dirs(pipe, settings.model, out)
                report = engine_peers.engine_peer(spec, None, target_dir, draft_dir, prompts, greedy_refs, config,
                                                  pipe.stop_token_ids, out / "peer-models")
                if report.get("status") == "ok":
                    store.save(f"peers-{spec.short}", report)
            reports[spec.key] = report
    if wanted & set(llama_peers.LLAMA_PEER_NAMES):   # llama.cpp, plain and with the draft, prompt by prompt in turn
        reports.update(llama_peers.stored(store, llama_peers.LlamaJob(
            wanted, settings.model.target, settings.model.tiny, peer_model_dirs(pipe, settings.model, out)[1],
            pipe.precision.name, llama_peers.threads(settings.llama_threads, settings.model.threads), block, prompts,
            greedy_refs, pipe.tokenizer, config, out / "peer-models", settings.llama_cpp)))
    for key, report in reports.items():  # the terminal says so too, not only the results files
        if report.get("status") != "ok":
            print(f"# peers: {key} {report.get('status')}: {report.get('reason', '')}", file=sys.stderr)
    return reports


def dataset_run(store: PartStore, pipe: Pipeline, ar, decoders, name: str, convs, config, concurrency,
                repeats: int = 1) -> DatasetRun:
    """`bench_dataset`, or its saved part when resuming."""
    part = store.load(f"dataset-{name}")
    if part is not None:
        return DatasetRun.from_dict(part)
    run = bench_dataset(pipe, ar, decoders, name, convs, config, concurrency, repeats)
    store.save(f"dataset-{name}", run.to_dict())
    return run


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


def load_bench_conversations(settings: BenchSettings) -> dict:
    return load_conversations(list(settings.datasets), settings.num_prompts, list(settings.dataset_files) or None)


def bench_decoders(pipe: Pipeline, proposers: tuple[str, ...]) -> dict[str, SpeculativeDecoder]:
    """The speculative decoder of each proposer to measure, in the order given (none given: the
    pipeline's own), all over the pipeline's target and draft."""
    if not proposers:
        return {pipe.decoder.proposer: pipe.decoder}
    return {p: pipe.decoder_for(p) for p in proposers}


def report_runs(runs: dict[str, DatasetRun], conversations: dict, proposer: str, concurrency, block: int,
                greedy: bool) -> tuple[dict, dict]:
    """One proposer's per-dataset entries and its overall entry (cycles pooled over every dataset)."""
    datasets, pooled = {}, {c: PairRuns() for c in concurrency}
    for name, run in runs.items():
        per_c = {}
        for c in concurrency:
            per_c[str(c)] = entry(run.runs[proposer][c], block, greedy)
            pooled[c].extend(run.runs[proposer][c])
        datasets[name] = dict(per_c[str(concurrency[0])], num_prompts=len(conversations[name]), by_concurrency=per_c)
    overall_c = {str(c): entry(pooled[c], block, greedy) for c in concurrency}
    overall = dict(overall_c[str(concurrency[0])], by_concurrency=overall_c,
                   mean_over_datasets=sum(d["acceptance_length"] or 0 for d in datasets.values()) / len(datasets))
    return datasets, overall


def run_bench(pipe: Pipeline, bench: BenchSettings) -> dict:
    out = Path(bench.output)
    out.mkdir(parents=True, exist_ok=True)
    require(pipe.decoder.proposer is not None,
            "bench needs a proposer (a draft, or --proposer lookup): the autoregressive baseline is built from the target")
    conversations = load_bench_conversations(bench)
    config = bench.generation(pipe.stop_token_ids)
    config.validate()
    greedy = config.temperature <= 0
    ar = pipe.decoder.variant(speculate="never") if bench.baseline else None
    decoders = bench_decoders(pipe, bench.proposers)
    lead = next(iter(decoders))
    block = decoders[lead].block_size(config)
    concurrency = bench.concurrency
    model = bench.model
    settings = {"target": model.target_label,
                "draft": pipe.draft_description, "trained_draft": pipe.trained_draft, "block_size": block,
                "speculate": pipe.decoder.speculate, "proposer": lead, "proposers": list(decoders),
                "datasets": list(conversations), "num_prompts": bench.num_prompts,
                "max_new_tokens": bench.max_new_tokens, "temperature": bench.temperature, "top_p": bench.top_p,
                "top_k": bench.top_k, "concurrency": list(concurrency), "repeats": bench.repeats, "device": model.device,
                **pipe.precision.record(), "exact_verify": pipe.decoder.target.exact_verify, "seed": model.seed, "peers": sorted(bench.peers), "baseline": ar is not None,
                "dataset_file": list(bench.dataset_files) or None, "machine": machine_identity()}
    weights = weights_digest(pipe.decoder.target.model, pipe.decoder.draft)
    store = PartStore(out, run_fingerprint(settings, weights), bench.resume)
    print(f"# bench: draft {pipe.draft_description}; proposers {', '.join(decoders)}; block {block}; "
          f"concurrency {concurrency}; {pipe.header()}", file=sys.stderr)
    warn_if_busy(model.device)
    warm = first_prompt(pipe, conversations)
    for decoder in [ar, *decoders.values()]:  # untimed warm-up: first-call overheads hit no side's figures
        if decoder is not None:
            decoder.generate([warm], GenerationConfig(max_new_tokens=min(8, bench.max_new_tokens), seed=model.seed))
    # the timed runs start with what the warm-up measured of the machine (costs), nothing of the draft
    decoders = {name: decoder.variant() for name, decoder in decoders.items()}

    runs: dict[str, DatasetRun] = {}
    ticks, commit = cpu_ticks(), git_commit()   # the commit whose code runs, read before the (long) run
    for name, convs in conversations.items():
        runs[name] = dataset_run(store, pipe, ar, decoders, name, convs, config, concurrency, bench.repeats)
        for p in decoders:
            d = entry(runs[name].runs[p][concurrency[0]], decoders[p].block_size(config), greedy)
            print(f"# {name}{'' if len(decoders) == 1 else f' ({p})'}: tau {fmt(d['acceptance_length'])}, "
                  f"speedup {fmt(d['speedup'])}x, mismatches {d['mismatches']}", file=sys.stderr)
    by_proposer = {}
    reference = reference_loader(pipe)
    audits = (float32_reference.audit_runs(runs, decoders, concurrency, bench.repeats, reference, pipe.precision.name)
              if greedy and ar is not None else None)
    for p in decoders:
        datasets, overall = report_runs(runs, conversations, p, concurrency, decoders[p].block_size(config), greedy)
        by_proposer[p] = {"datasets": datasets, "overall": overall}
        if audits is not None:
            float32_reference.annotate(by_proposer[p], audits[p])
            print(f"# audit ({p}, batch {concurrency[0]}): {audits[p][float32_reference.OVERALL][concurrency[0]].line()}",
                  file=sys.stderr)
    peer_prompts = {name: run.prompts for name, run in runs.items()}
    peer_refs = {name: run.outputs for name, run in runs.items()}
    peers = run_peers(pipe, bench, config, peer_prompts, peer_refs, out, block, store) if bench.peers else {}
    if bench.reference and ar is not None and pipe.precision.name != "float32":
        row = store.load("reference-float32")
        if row is None:
            print("# bench: the float32 reference row (plain decoding of the float32 target, batch 1)", file=sys.stderr)
            row = float32_reference.plain_row(float32_reference.reference_model(reference), peer_prompts,
                                              peer_refs if greedy else None, config, pipe.stop_token_ids)
            store.save("reference-float32", row)
        peers = {"dflash2_plain_float32": row, **peers}
    if "dflash_reference" in peers:   # the reference package drafts alone: the draft proposer's cycles, if measured
        mine = "draft" if "draft" in decoders else lead
        compare_cycles(peers["dflash_reference"], {name: run.cycles[mine] for name, run in runs.items()},
                       concurrency[0] == 1 and greedy and mine == "draft")
    info = dict(machine_info(), steal_share=steal_share(ticks, cpu_ticks()))
    results = {
        "settings": dict(settings, definitions=DEFINITIONS, weights_sha256=weights, resumed_parts=store.reused),
        "datasets": by_proposer[lead]["datasets"], "overall": by_proposer[lead]["overall"],
        "proposers": by_proposer, "peers": peers,
        "machine": machine_line(info), "machine_details": info, "commit": commit,
    }
    results["plots"] = plots.bench_plots(results, out)
    write_json(out / "results.json", results)
    write_text(out / "results.md", render_markdown(results))
    print(f"# wrote {out / 'results.json'}, {out / 'results.md'} and {len(results['plots'])} plots", file=sys.stderr)
    return results


def first_prompt(pipe: Pipeline, conversations) -> list[int]:
    conv = next(iter(conversations.values()))[0]
    return encode_messages(pipe.tokenizer, [{"role": "user", "content": conv.turns[0]}])


def main(argv: list[str] | None = None) -> int:
    settings = parse_args(sys.argv[1:] if argv is None else argv)
    load_bench_conversations(settings)  # bad prompt files fail before any load
    run_bench(build_pipeline(settings.model), settings)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
