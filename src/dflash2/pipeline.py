"""Putting a target and a draft together: what every command (generate, bench, analyze,
regenerate) does first.

Contract:
- `new_draft(target_config, tokenizer, shape=DraftShape(), seed=0)`: a correctly shaped, freshly
  initialised (untrained) draft from the draft factory (`model.factory.create_draft`); it needs
  the target's Hugging Face config and tokenizer, not its weights.
- `shipped_draft_path(target_name)`: the trained draft shipped in the package for a built-in
  target, or None.
- `prepare_decoder(target, draft, device, dtype, no_draft, draft_dtype, speculate, proposer,
  implementation, lattice)` ->
  `DecoderPlan`: every check that needs no target weights, in this order: the options (`--draft`
  with `--no-draft` is refused, so is a draft-based `--proposer` with `--no-draft`), the draft (loaded and checked: config, weights headers, shapes,
  NaN / inf), the target's config and tokenizer, and whether the draft was made for this target
  ("this draft was made for a target with hidden size H, vocab V, L layers (e.g. the built-in X)").
  `plan.check_prompt(ids, config)` applies the engine's context rule with the plan's block size;
  `plan.load()` loads the target's weights and returns the `Pipeline`. `Pipeline.decoder_for(p)`:
  a decoder of the same target and draft proposing from `p` (proposers measured side by side).
- `proposer` (`decoding.proposers.kinds.PROPOSERS`): `lookup` loads no draft (prompt / n-gram lookup
  alone, with or without `--no-draft`); `draft` and `hybrid` use the draft; `mtp` an MTP head:
  `draft` a head's checkpoint (`model.families.load_draft` tells the two kinds apart;
  `kinds.check_family` refuses a DFlash draft for `mtp` and a head for `draft`), else the target's
  own (`mtp.*` tensors; a target without one is refused); `hybrid` with a head's checkpoint runs it
  beside lookup; None: `DEFAULT_PROPOSER` with a
  trained draft (the user's or the shipped one), `lookup` for a target no trained draft ships for
  (an untrained draft cannot pay; `proposer="draft"` still makes one), and plain decoding with
  `--no-draft` (the baseline keeps its meaning).
- `implementation` (`auto` | `transformers`): the target's classes, as `targets.builtin.open_target`
  chooses them (dflash2's own Llama for SmolLM2 under `auto`; transformers' when asked, for
  Hugging Face `generate()`).
- `weights` (`WEIGHTS`, default "float"): "int8" / "int4" run the target's layers on weight-only
  quantized weights (`model.quantized`; its LM head and embeddings stay as loaded), on the CPU
  with bfloat16 activations and dflash2's own Llama only, each refused in one line before the
  weights load (`check_weights`). The target is then the quantized model: plain decoding, every
  proposer and the lossless checks all run against it (`Precision.weights` says so in headers and
  results files).
- `lattice` (default False): the draft's lattice's second path may be verified beside its path as
  a token tree (`decoding.loop.engine`), where the policy prices it as paying; False: the draft's path
  alone (measured faster on a 2-core CPU, BENCHMARKS.md section 1.3).
- `load_decoder(...)` = `prepare_decoder(...).load()` -> `Pipeline` with the decoder, the
  tokenizer, the stop tokens and a one-line description of the draft in use ("untrained" when no
  trained draft exists for that target).
- `tiny_pipeline(seed, speculate)`: a random tiny Llama target and DFlash2 draft (`targets.tiny`)
  with the character-level `TinyTokenizer` (seconds on a CPU; the hidden `--tiny` option, tests).
  `build_pipeline(model)` loads what a command's `ModelSettings` name (tiny or real).
  `draft=None` there means the default draft (the shipped one); `draft=NO_DRAFT` means none
  (the same as `no_draft=True`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

import torch

from dflash2.argparsing import ModelSettings
from dflash2.decoding.loop.context import check_context
from dflash2.decoding.loop.engine import GenerationConfig, SpeculativeDecoder
from dflash2.decoding.proposers import kinds
from dflash2.decoding.policy import SPECULATE_MODES
from dflash2.decoding.verifier import exact as exact_rules
from dflash2.decoding.verifier.adapter import TargetAdapter, context_limit
from dflash2.runtime.devices import Precision, native_bfloat16, settle
from dflash2.runtime.dtypes import parse_dtype
from dflash2.errors import DFlash2Error, require
from dflash2.runtime.machine import require_memory, use_threads
from dflash2.model.config import DFlash2Config
from dflash2.model.draft import DFlash2DraftModel
from dflash2.model.factory import create_draft
from dflash2.model.families import family_of, kind, load_draft, target_head
from dflash2.model.shape import DEFAULT_SHAPE, DraftShape, target_text_config
from dflash2.model import projections, quantized
from dflash2.targets import llama
from dflash2.targets.builtin import (BUILTIN_TARGETS, TargetFiles, TargetShape, builtins_shaped, load_target_model,
                                     open_target)
from dflash2.targets.chat import choose_mask_token, stop_token_ids

def draft_dtype_for(name: str, device: str, target_dtype: torch.dtype) -> torch.dtype:
    """`auto`: bfloat16 on CPUs with native bf16 matmul (there the draft is memory-bound), else the
    target's dtype: on CUDA a small draft is launch-bound and ran faster in fp32 than in bf16 (H200,
    docs/cycle-cost.md, on a GPU), while a large target in bf16 gets a bf16 draft. The draft's precision
    cannot change the output (the target decides every token)."""
    if name != "auto":
        return parse_dtype(name)
    if torch.device(device).type == "cpu" and native_bfloat16(device)[0]:
        return torch.bfloat16
    return target_dtype


def draft_parameters(target_config, shape: DraftShape, mask_token_id: int) -> int:
    """The parameter count of a draft of `shape`, from drafts of one and two layers built on the
    meta device (no memory): the rest of the shape adds the same tensors once per layer."""
    counts = []
    for layers in (1, 2):
        config = DFlash2Config.for_target(target_config, replace(shape, num_layers=layers), mask_token_id=mask_token_id)
        with torch.device("meta"):
            counts.append(sum(p.numel() for p in DFlash2DraftModel(config).parameters()))
    return counts[0] + (shape.num_layers - 1) * (counts[1] - counts[0])


def check_draft_shape(target_config, shape: DraftShape, mask_token_id: int) -> None:
    """Refuse a shape no command could use (a block that fills the target's context) or that this
    machine cannot hold (float32 weights, twice: the model and the copy written out)."""
    limit = context_limit(target_text_config(target_config))
    require(shape.block_size <= limit - 2,
            f"--block-size {shape.block_size} leaves no room in the target's context of {limit} positions (a prompt "
            f"token, the block and a new token must fit); use at most {limit - 2} (trained drafts use 8-16)")
    nbytes = 2 * 4 * draft_parameters(target_config, shape, mask_token_id)
    require_memory(nbytes, f"a draft with {shape.num_layers} layers and MLP width "
                           f"{shape.intermediate_size or target_text_config(target_config).intermediate_size}",
                   "use fewer --layers or a smaller --intermediate-size")


def new_draft(target_config, tokenizer, shape: DraftShape = DEFAULT_SHAPE, seed: int = 0) -> DFlash2DraftModel:
    """An untrained draft of `shape` (default: the published shape) for a target's Hugging Face
    config (the target's weights are not needed), in eval mode; `check_draft_shape` first."""
    mask = choose_mask_token(tokenizer, target_text_config(target_config).vocab_size)
    check_draft_shape(target_config, shape, mask)
    return create_draft(target_config, shape, mask_token_id=mask, seed=seed).eval()


def shipped_draft_path(target_name: str) -> Path | None:
    path = Path(str(resources.files("dflash2") / "checkpoints" / f"{target_name}-dflash2"))
    return path if (path / "config.json").is_file() else None


FLOAT32 = Precision("float32", "float32", "as asked")


@dataclass
class Pipeline:
    decoder: SpeculativeDecoder
    tokenizer: object
    stop_token_ids: tuple[int, ...]
    draft_description: str
    trained_draft: bool
    precision: Precision = FLOAT32      # the target's, as decided before it loaded
    target_files: TargetFiles | None = None   # where the target came from (the audit's float32 reference)
    device: str = "cpu"

    def header(self) -> str:
        """The precision and the verification mode in one phrase, for every command's header."""
        exact = ", exact verify" if self.decoder.target.exact_verify else ""
        return f"{self.precision.describe()}{exact}"

    def decoder_for(self, proposer: str) -> SpeculativeDecoder:
        """A decoder of the same target (and draft) whose tokens come from `proposer`, for measuring
        proposers side by side: `self.decoder` when it is that one, else its `variant`."""
        kinds.check_proposer(proposer)
        return self.decoder if proposer == self.decoder.proposer else self.decoder.variant(proposer)


def check_draft_fits(draft: DFlash2Config, target: TargetFiles, where: str) -> None:
    """Refuse a draft made for another target, saying which shape of target it was made for."""
    made_for = TargetShape(draft.target_hidden_size, draft.vocab_size, draft.num_target_layers)
    actual = TargetShape.of(target.config)
    if made_for == actual:  # the draft's own hidden size is checked by the engine (it borrows the target's embeddings)
        return
    known = builtins_shaped(made_for)
    example = f" (e.g. the built-in '{known[0]}')" if known else ""
    raise DFlash2Error(f"draft '{where}' was made for a target with {made_for.describe()}{example}, not for "
                       f"'{target.name}' ({actual.describe()}); give a draft trained for '{target.name}' "
                       f"(dflash2 init-draft --target {target.name} makes an untrained one)")


@dataclass
class DecoderPlan:
    """Everything checked and loaded that loads fast (options, the draft, the target's config and
    tokenizer); `load()` then loads the target's weights (the slow part) and builds the `Pipeline`.
    Commands check their input against `tokenizer` / `block_size` / `max_positions` in between."""

    target: TargetFiles
    device: str
    dtype: torch.dtype
    speculate: str
    no_draft: bool
    draft: DFlash2DraftModel | None     # None: autoregressive, or an untrained draft made at load()
    draft_dtype: torch.dtype
    description: str
    trained: bool
    proposer: str | None = None         # None: plain decoding (--no-draft)
    lattice: bool = False               # the draft's lattice's second path as a tree branch
    precision: Precision = FLOAT32
    exact_verify: bool = False          # verify passes reproduce one-token steps (decoding.verifier.exact)

    @property
    def tokenizer(self):
        return self.target.tokenizer

    @property
    def max_positions(self) -> int:
        return context_limit(target_text_config(self.target.config))

    def block_size(self, config: GenerationConfig) -> int:
        """The engine's block size for the draft `load()` will use (an untrained one: DEFAULT_SHAPE's)."""
        draft = self.draft.config if self.draft is not None else DEFAULT_SHAPE
        proposer = None if self.speculate == "never" else self.proposer
        return kinds.block_size(proposer, draft.block_size, config.block_size)

    def check_prompt(self, ids: list[int], config: GenerationConfig) -> None:
        """The engine's context rule, before the target's weights load."""
        check_context(len(ids), config.max_new_tokens, self.block_size(config), self.max_positions)

    def load(self) -> Pipeline:
        model = load_target_model(self.target, self.device, self.dtype)
        if self.precision.weights != "float":
            projections.set_weights(model, self.precision.weights)
        tokenizer = self.target.tokenizer
        stops = stop_token_ids(tokenizer, model.config)
        made = dict(precision=self.precision, target_files=self.target, device=self.device)
        if self.proposer is None:
            return Pipeline(SpeculativeDecoder(TargetAdapter(model, exact_verify=self.exact_verify)), tokenizer,
                            stops, "none (autoregressive)", False, **made)
        if self.proposer == "lookup":
            decoder = SpeculativeDecoder(TargetAdapter(model, exact_verify=self.exact_verify), speculate=self.speculate,
                                         proposer="lookup")
            return Pipeline(decoder, tokenizer, stops, "none (lookup proposals)", False, **made)
        draft = self.draft if self.draft is not None else new_draft(model.config, tokenizer)
        draft = draft.to(device=self.device, dtype=self.draft_dtype)
        adapter = TargetAdapter(model, draft.config.target_layer_ids, exact_verify=self.exact_verify)
        decoder = SpeculativeDecoder(adapter, draft, speculate=self.speculate, proposer=self.proposer,
                                     lattice=self.lattice)
        return Pipeline(decoder, tokenizer, stops,
                        f"{self.description} [{kind(draft)}, {str(self.draft_dtype).removeprefix('torch.')}]",
                        self.trained, **made)


WEIGHTS = ("float",) + quantized.SCHEMES    # --weights: the target's layers as loaded, or quantized


def check_weights(weights: str, device: str, precision: Precision, files: TargetFiles) -> None:
    """Refuse, in one line and before any weights load, a `--weights` the run cannot honour."""
    require(weights in WEIGHTS, f"--weights must be one of {', '.join(WEIGHTS)}, got '{weights}'")
    if weights == "float":
        return
    require(device == "cpu", f"--weights {weights} runs torch's weight-only CPU kernels; the device is {device}")
    require(precision.name == "bfloat16",
            f"--weights {weights} computes with bfloat16 activations (its CPU kernels), and this run is "
            f"{precision.name} ({precision.reason}); give --dtype bfloat16")
    config = files.config
    require(isinstance(config, llama.LlamaTargetConfig),
            f"--weights {weights} quantizes dflash2's own Llama (SmolLM2 and other Llama targets); "
            f"'{files.name}' runs transformers' {type(config).__name__.removesuffix('Config')} classes")
    if weights == "int4":
        heads = config.num_attention_heads * config.attention_head_dim
        inputs = (config.hidden_size, config.intermediate_size, heads)
        outputs = (heads + 2 * config.num_key_value_heads * config.attention_head_dim, 2 * config.intermediate_size,
                   config.hidden_size)
        require(all(n % quantized.INT4_GROUP == 0 for n in inputs) and all(n % 16 == 0 for n in outputs),
                f"--weights int4 needs layer input sizes divisible by {quantized.INT4_GROUP} and output sizes by 16; "
                f"'{files.name}' has inputs {inputs} and outputs {outputs}")


def prepare_decoder(target: str = "smollm2", draft: str | None = None, device: str = "cpu",
                    dtype: str = "auto", no_draft: bool = False, draft_dtype: str = "auto",
                    speculate: str = "auto", proposer: str | None = None,
                    implementation: str = "auto", lattice: bool = False, exact_verify: bool = False,
                    weights: str = "float") -> DecoderPlan:
    """Check the options, load the draft (refusing bad weights) and the target's config and
    tokenizer, and check that the draft fits the target: every input check that needs no target
    weights, so bad input fails in well under a second instead of after the target loads."""
    require(speculate in SPECULATE_MODES, f"--speculate must be one of {', '.join(SPECULATE_MODES)}, got '{speculate}'")
    require(not (no_draft and draft is not None), "give at most one of --draft and --no-draft")
    kinds.check_proposer(proposer, "--proposer")
    require(not (no_draft and proposer in kinds.DRAFT_PROPOSERS),
            f"--proposer {proposer} needs a draft, and --no-draft asks for none; drop one of them")
    require(not (proposer == "lookup" and draft is not None),
            "--proposer lookup uses no draft, so --draft has no effect; drop one of them")
    chosen = proposer
    if proposer is None:
        proposer = None if no_draft else kinds.DEFAULT_PROPOSER
    no_draft = no_draft or proposer == "lookup"
    device, precision = settle(device, dtype)
    precision = replace(precision, weights=weights)
    torch_dtype = precision.torch_dtype
    draft_torch_dtype = draft_dtype_for(draft_dtype, device, torch_dtype)
    draft_model, description, trained = None, "none (autoregressive)", False
    if draft is not None:  # a user's draft: checked (and loaded) before anything of the target
        draft_model, description, trained = load_draft(draft, draft_torch_dtype), f"{draft}", True
        kinds.check_family(proposer, family_of(draft_model), "--proposer", f"--draft '{draft}'")
    files = open_target(target, implementation)
    check_weights(weights, device, precision, files)
    if draft is None and proposer == "mtp":   # the target's own MTP head (Qwen3.5, Qwen3-Next checkpoints)
        draft_model = target_head(files, draft_torch_dtype)
        require(draft_model is not None, f"--proposer mtp: target '{target}' ships no MTP head (no mtp.* tensors); "
                                         "give a trained head with --draft DIR (dflash2 train configs/smollm2-mtp.yaml)")
        description, trained = f"the MTP head of '{target}'", True
    elif draft is None and not no_draft:
        shipped = shipped_draft_path(target) if target in BUILTIN_TARGETS else None
        if shipped is None and chosen is None:  # an untrained draft cannot pay (tau 1.0): lookup, which can
            proposer, no_draft = "lookup", True
        elif shipped is None:
            description = f"untrained DFlash2 draft for '{target}' (no trained draft ships for it yet)"
        else:
            draft_model = DFlash2DraftModel.from_pretrained(shipped, draft_torch_dtype)
            description, trained = f"shipped {shipped.name}", True
    if draft_model is not None:
        check_draft_fits(draft_model.config, files, draft or description)
    if exact_verify:
        exact_rules.check_plan(target_text_config(files.config), device, torch_dtype)
    if proposer == "lookup":
        description = "none (lookup proposals)" if chosen is not None else (
            f"none (lookup proposals: no trained draft ships for '{target}'; --proposer draft uses an untrained one)")
    return DecoderPlan(files, device, torch_dtype, speculate, no_draft, draft_model, draft_torch_dtype, description,
                       trained, proposer, lattice, precision, exact_verify)


class _NoDraft:
    """The `draft=` value that means plain autoregressive decoding (`draft=None` means the default draft)."""

    def __repr__(self) -> str:
        return "NO_DRAFT"


NO_DRAFT = _NoDraft()


def load_decoder(target: str = "smollm2", draft: "str | _NoDraft | None" = None, device: str = "cpu",
                 dtype: str = "auto", no_draft: bool = False, draft_dtype: str = "auto",
                 speculate: str = "auto", proposer: str | None = None, implementation: str = "auto",
                 lattice: bool = False, exact_verify: bool = False, weights: str = "float") -> Pipeline:
    """`draft`: a checkpoint directory; None, the shipped draft for a built-in target (an untrained
    one for other targets); `NO_DRAFT` (or `no_draft=True`), no draft at all. `implementation`:
    the target's classes (`targets.builtin.open_target`)."""
    if draft is NO_DRAFT:
        draft, no_draft = None, True
    return prepare_decoder(target, draft, device, dtype, no_draft, draft_dtype, speculate, proposer,
                           implementation, lattice, exact_verify, weights).load()


def tiny_pipeline(seed: int = 0, speculate: str = "auto", lattice: bool = False) -> Pipeline:
    # imported here: the tiny families' configs pull in model code no real target needs (a second of start-up)
    from dflash2.targets.tiny import TinyTokenizer, tiny_draft, tiny_target

    target = tiny_target("llama", seed=seed)
    draft = tiny_draft(target, seed=seed)
    decoder = SpeculativeDecoder(TargetAdapter(target, draft.config.target_layer_ids), draft, speculate=speculate,
                                 lattice=lattice)
    return Pipeline(decoder, TinyTokenizer(target.config.vocab_size), (), "tiny random DFlash2 draft [DFlash2]", False,
                    Precision("float32", "float32", "tiny random models are float32"))


def build_pipeline(model: ModelSettings) -> Pipeline:
    use_threads(model.threads)
    if model.tiny:
        require(model.weights == "float", f"--weights {model.weights} quantizes dflash2's own Llama; --tiny runs "
                                          "transformers' tiny Llama")
        torch.manual_seed(model.seed)
        return tiny_pipeline(model.seed, model.speculate, model.lattice)
    return load_decoder(model.target, model.draft, model.device, model.dtype, speculate=model.speculate,
                        proposer=model.proposer, lattice=model.lattice, exact_verify=model.exact_verify,
                        weights=model.weights)
