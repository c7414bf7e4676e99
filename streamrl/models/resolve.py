"""Which directory a model name means (``streamrl.models``' module doc gives the order):
``resolve_model`` builds, converts or downloads it; ``check_model`` is ``streamrl validate``'s
look at the same name, building and downloading no weights."""

from __future__ import annotations

from pathlib import Path

from streamrl.models.builtin import (
    GEMMA3,
    RANDOM_MODELS,
    SMOLLM2,
    gemma3_dir,
    random_dir,
    smollm2_dir,
    tiny_llama_dir,
)
from streamrl.models.gguf import gguf_dir
from streamrl.models.hub import hub_dir, is_hub_id
from streamrl.models.lora import adapter_base, is_adapter_dir, merged_adapter_dir
from streamrl.models.store import TINY, ModelNotFoundError, check_model_dir, streamrl_home
from streamrl.models.tiny import PREFIX, tiny_dir


def resolve_model(
    name: str, *, revision: str | None = None, tiny_hidden: int = 64, tiny_layers: int = 2
) -> Path:
    """Return a local directory with ``config.json``, safetensors weights and a tokenizer:
    a built-in, a local directory, a ``.gguf`` file or a hub id, in that order
    (``streamrl.models``' module doc). ``revision`` (a branch, tag or commit) applies to a hub
    id only. Raises ``ModelNotFoundError`` with a one-line message for anything that cannot be
    used."""
    if name == SMOLLM2:
        return smollm2_dir()
    if name == GEMMA3:
        return gemma3_dir()
    if name == TINY:
        return tiny_llama_dir(tiny_hidden, tiny_layers)
    if name.startswith(PREFIX):  # other architectures (streamrl.models.tiny)
        return tiny_dir(name)
    if name in RANDOM_MODELS:
        return random_dir(name)
    path = run_model_dir(Path(name).expanduser())
    if path.is_dir() and is_adapter_dir(path):  # a LoRA run's adapter/: merged into its base
        base = resolve_model(adapter_base(path))
        return merged_adapter_dir(path, base, streamrl_home() / "models")
    if path.is_dir():
        check_model_dir(path)
        return path
    if path.suffix == ".gguf":
        return gguf_dir(path)
    if path.parent.is_dir() and str(path.parent) not in (".", ""):
        # ``runs/teacher`` where ``runs/`` exists: a local path that is not there yet, not
        # a hub id to look up (the hub's error would say nothing of the missing directory).
        raise ModelNotFoundError(f"model {name!r} not found: no such directory")
    if is_hub_id(name):
        return _from_hub(name, revision)
    raise ModelNotFoundError(_not_found(name))


def _from_hub(name: str, revision: str | None, weights: bool = True) -> Path:
    """``hub_dir``; where it fails, the message also says no such directory is here (a
    ``runs/teacher`` not made yet reads as a hub id too)."""
    try:
        return hub_dir(name, revision, weights=weights)
    except ModelNotFoundError as exc:
        raise ModelNotFoundError(
            f"model {name!r}: no such directory under {Path.cwd()}, and as a hub id: {exc}"
        ) from None


def check_model(name: str, *, revision: str | None = None) -> Path | None:
    """What ``streamrl validate`` checks of ``model.name`` without building or downloading any
    weights: a local directory or ``.gguf`` file exists (and the directory passes
    ``check_model_dir``); a hub id's repo and revision exist, may be read, hold safetensors,
    and its config and tokenizer (downloaded into the HF cache, as the launch would) pass
    ``check_model_dir``. Other names (the built-ins) are the launch's to check. Returns the
    directory holding the model's config.json when one was checked, else None."""
    path = run_model_dir(Path(name).expanduser())
    if path.is_dir() and is_adapter_dir(path):  # merged into its base at the launch
        return check_model(adapter_base(path))
    if path.is_dir():
        check_model_dir(path)
        return path
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelNotFoundError(f"model {name!r} not found: no such .gguf file")
    elif "/" in name and is_hub_id(name):
        return _from_hub(name, revision, weights=False)
    elif "/" in name or name.startswith("."):
        raise ModelNotFoundError(_not_found(name))
    return None


def run_model_dir(path: Path) -> Path:
    """A streamrl run directory (``config.yaml``, no ``config.json``) means the model it
    exported (``hf/``, written when the run ends); any other path is itself."""
    if (path / "config.yaml").is_file() and not (path / "config.json").exists():
        if not (path / "hf" / "config.json").is_file():
            raise ModelNotFoundError(
                f"{path} is a streamrl run without an exported model: export one with "
                f"`streamrl export {path} --out {path / 'hf'}` (add --merge for a LoRA run)"
            )
        return path / "hf"
    return path


def _not_found(name: str) -> str:
    builtins = ", ".join([SMOLLM2, TINY, *RANDOM_MODELS])
    return (
        f"model {name!r} not found: not a local directory, not a .gguf file, not a hub id "
        f"(owner/name), and not one of the built-ins ({builtins})"
    )
