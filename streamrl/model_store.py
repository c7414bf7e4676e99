"""Where built and converted models live, and what every built model shares: the one
``ModelNotFoundError``, ``$STREAMRL_HOME``, atomic publishing of a model directory, and the
character tokenizer of the random test models (``streamrl.models`` resolves names and
re-exports these; ``streamrl.tiny_models`` builds the test architectures)."""

from __future__ import annotations

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
