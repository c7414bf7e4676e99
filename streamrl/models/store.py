"""Where built and converted models live, and what every model directory shares: the one
``ModelNotFoundError``, ``$STREAMRL_HOME``, atomic publishing of a model directory, the check
that a directory is one a launch can use (``check_model_dir``), and the character tokenizer of
the random test models (``streamrl.models.builtin`` and ``streamrl.models.tiny`` build those)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

TINY = "tiny-random-llama"


class ModelNotFoundError(FileNotFoundError):
    """The model name resolves to nothing on this machine; the message says what to do."""


def streamrl_home() -> Path:
    return Path(os.environ.get("STREAMRL_HOME", Path.home() / ".cache" / "streamrl"))


def publish_atomically(build, target: Path) -> Path:
    """Build a model directory in a temp dir and rename it into place (safe under races).
    One process on this host builds a target at a time (a lock file in the temp directory,
    released if the builder dies): another asking meanwhile waits and takes that copy
    instead of converting the same model again (two test workers, two runs started
    together). Hosts sharing a home still race safely, by the rename."""
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha1(str(target.resolve()).encode()).hexdigest()[:16]
    with open(Path(tempfile.gettempdir()) / f"streamrl-model-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "config.json").is_file():
            return target
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


def char_token_ids() -> dict[str, int]:
    """The special-token ids of ``build_char_tokenizer`` (its vocabulary order)."""
    return {
        "pad_token_id": _SPECIALS.index("<pad>"),
        "bos_token_id": _SPECIALS.index("<bos>"),
        "eos_token_id": _SPECIALS.index("<eos>"),
    }


CHAR_VOCAB = len(_SPECIALS) + len(_CHARS)  # the character tokenizer's vocabulary size


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
        raise ModelNotFoundError(f"{who}: config.json is unreadable: {one_line(exc)}") from None
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


def one_line(exc: BaseException, limit: int = 200) -> str:
    """An exception's message on one line (the hub's span several), cut to ``limit``."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
