"""A hub id ``owner/name`` as a model: a snapshot in the HF cache, downloaded with
``huggingface_hub.snapshot_download`` (``HF_HOME``/``HF_HUB_CACHE``, ``HF_ENDPOINT``,
``HF_TOKEN`` honoured), only what a causal LM needs (configs, tokenizer files, safetensors; a
repo without safetensors is refused); with ``HF_HUB_OFFLINE=1``, or the hub unreachable, from
the cache alone. Every failure is one line (``ModelNotFoundError``)."""

from __future__ import annotations

import glob
import re
from pathlib import Path

from streamrl.models.store import ModelNotFoundError, check_model_dir, one_line

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]*[A-Za-z0-9_]")


def is_hub_id(name: str) -> bool:
    """``owner/name`` as the hub spells a repo id (checked before any request is made)."""
    return bool(_HUB_ID.fullmatch(name)) and ".." not in name and "--" not in name


def hub_files(name: str, files: list[str], revision: str | None, weights: bool) -> list[str]:
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


def hub_dir(name: str, revision: str | None, weights: bool = True) -> Path:
    """A hub model's snapshot in the HF cache, downloaded with ``snapshot_download`` (only
    ``hub_files``) unless the hub is offline (``HF_HUB_OFFLINE``) or unreachable; then from the
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
        patterns = [glob.escape(f) for f in hub_files(name, files, revision, with_weights)]
        try:
            snapshot = Path(snapshot_download(name, revision=revision, allow_patterns=patterns))
        except Exception as exc:  # noqa: BLE001
            _raise_for_hub_error(exc, name, revision, endpoint)
            raise ModelNotFoundError(
                f"{where}: download from {endpoint} failed: {one_line(exc)}"
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
            f"{where}: {endpoint} answered HTTP {status}: {one_line(exc)}"
        ) from None


def _cached_hub_dir(
    name: str, revision: str | None, weights: bool, offline: bool, unreachable: BaseException | None
) -> Path:
    """The snapshot of ``name`` in the local HF cache alone (offline, or the hub unreachable):
    the files ``hub_files`` picks from the cached listing, all present, or one line."""
    from huggingface_hub import constants, get_cached_repo_tree, snapshot_download
    from huggingface_hub import errors as hub_errors

    where = f"model {name!r}{_at(revision)}"
    if offline:
        why = "HF_HUB_OFFLINE=1: run once with the hub reachable, or `hf download " + name + "`"
    else:
        why = (
            f"the hub {constants.ENDPOINT} is unreachable ({one_line(unreachable, 120)}): "
            "check the connection (or HF_ENDPOINT)"
        )
    cache = constants.HF_HUB_CACHE
    try:
        listed = [f.path for f in get_cached_repo_tree(name, revision=revision)]
        patterns = [glob.escape(f) for f in hub_files(name, listed, revision, weights)]
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
