"""A ``.gguf`` file as a model: dequantised by transformers once into a bf16 safetensors
directory (``convert_gguf``), cached under ``$STREAMRL_HOME/models/`` by the file's path, size
and mtime (``gguf_dir``). The built-ins shipped as GGUF (``streamrl.models.builtin``) convert
the same way."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from streamrl.models.store import (
    ModelNotFoundError,
    check_model_dir,
    one_line,
    publish_atomically,
    streamrl_home,
)


def gguf_dir(gguf: Path) -> Path:
    """A ``.gguf`` file dequantised once into safetensors, cached by its path, size and mtime
    under ``$STREAMRL_HOME/models/gguf-<stem>-<hash>`` (a changed file converts anew)."""
    if not gguf.is_file():
        raise ModelNotFoundError(f"model {str(gguf)!r} not found: no such .gguf file")
    stat = gguf.stat()
    key = f"{gguf.resolve()}\\0{stat.st_size}\\0{stat.st_mtime_ns}"
    digest = hashlib.sha1(key.encode()).hexdigest()[:10]

    def build(out: Path) -> None:
        try:
            convert_gguf(gguf, out)
        except Exception as exc:  # transformers' reasons (architecture, quantisation) vary
            raise ModelNotFoundError(
                f"model {str(gguf)!r}: transformers cannot convert this GGUF: {one_line(exc)}"
            ) from None

    target = publish_atomically(build, streamrl_home() / "models" / f"gguf-{gguf.stem}-{digest}")
    check_model_dir(target, name=str(gguf))
    return target


# --------------------------------------------------------------------------- a hub id


@contextmanager
def _one_reader_per_file() -> Iterator[None]:
    """transformers parses a GGUF's metadata anew for the config, the tokenizer and the
    weights: three ``gguf.GGUFReader`` builds of the same file, each reading the vocabulary
    one element at a time (Gemma-3's 262,144 tokens: about 15 s a build on one core).
    Meanwhile they share one reader per file; it is only read (tensors are memory-mapped
    views, dequantised into new arrays), so the conversion is the same bit for bit."""
    import gguf

    original = gguf.GGUFReader
    readers: dict[tuple, object] = {}

    def shared(path, *args, **kwargs):
        key = (str(path), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = original(path, *args, **kwargs)
        return readers[key]

    gguf.GGUFReader = shared  # transformers imports it inside each call, from the module
    try:
        yield
    finally:
        gguf.GGUFReader = original


def convert_gguf(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with _one_reader_per_file():
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
