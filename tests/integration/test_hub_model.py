"""A hub id as ``model.name`` downloads like transformers: from the stand-in hub
(tests/hub_server.py, on 127.0.0.1) into a fresh ``HF_HOME``, only the files a causal LM needs,
pinned by ``model.revision``, from the cache alone when ``HF_HUB_OFFLINE=1``; every way it can
fail is one line and, from the CLI, exit 2 before any role starts."""

from __future__ import annotations

import filecmp
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hub_server import HubServer, hub_env, use_hub

from streamrl.models import ModelNotFoundError, resolve_model

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
REPO = "streamrl-test/tiny-llama"
TOKEN = "hf_test_token"
# What a causal LM needs of the tiny model's directory (save_pretrained + the tokenizer).
NEEDED = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
}


def _copy(src: Path, dst: Path, **extra: bytes) -> Path:
    shutil.copytree(src, dst)
    for name, data in extra.items():
        (dst / name.replace("__", "/")).parent.mkdir(parents=True, exist_ok=True)
        (dst / name.replace("__", "/")).write_bytes(data)
    return dst


def _other_weights(src: Path, dst: Path) -> Path:
    """The tiny model with every tensor shifted by 1: the same shapes, other weights."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = {
        k: (v.float() + 1).to(v.dtype) for k, v in load_file(src / "model.safetensors").items()
    }
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The served repos: the tiny model (plus files no causal LM needs), its ``v2`` weights, a
    gated copy, and repos that cannot be used: .bin only, an unknown architecture, no
    tokenizer."""
    tiny = resolve_model("tiny-random-llama")
    assert NEEDED <= {p.name for p in tiny.iterdir()}, sorted(p.name for p in tiny.iterdir())
    root = tmp_path_factory.mktemp("repos")
    junk = {"pytorch_model.bin": b"\0" * 1000, "onnx__model.onnx": b"\1" * 100, "README.md": b"#"}
    bin_only = _copy(tiny, root / "bin-only", **{"pytorch_model.bin": b"\0" * 1000})
    (bin_only / "model.safetensors").unlink()
    alien = _copy(tiny, root / "alien")
    (alien / "config.json").write_text('{"model_type": "mamba9000", "architectures": ["M9"]}')
    mute = _copy(tiny, root / "mute")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (mute / name).unlink()
    return {
        "main": _copy(tiny, root / "main", **junk),
        "v2": _other_weights(tiny, root / "v2"),
        "gated": _copy(tiny, root / "gated"),
        "bin-only": bin_only,
        "alien": alien,
        "mute": mute,
    }


@pytest.fixture
def hub(repos: dict[str, Path]) -> Iterator[HubServer]:
    with HubServer(
        {
            REPO: repos["main"],
            "streamrl-test/gated": repos["gated"],
            "streamrl-test/bin-only": repos["bin-only"],
            "streamrl-test/alien": repos["alien"],
            "streamrl-test/mute": repos["mute"],
        },
        token=TOKEN,
        gated={"streamrl-test/gated"},
        revisions={REPO: {"v2": repos["v2"]}},
    ) as server:
        yield server


def _streamrl(env: dict[str, str], *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "streamrl.cli", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _one_line(result: subprocess.CompletedProcess) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1, (result.returncode, result.stderr)
    return lines[0]


def _resolve_gets(hub: HubServer, repo: str = REPO) -> list[str]:
    """The files of ``repo`` the hub sent (GET of /resolve/, any revision)."""
    prefix = f"/{repo}/resolve/"
    return sorted(
        path.split("/resolve/", 1)[1].split("/", 1)[1]
        for method, path, status in hub.log
        if method == "GET" and path.startswith(prefix) and status == 200
    )


def _same_files(snapshot: Path, served: dict[str, Path]) -> None:
    names = sorted(p.name for p in snapshot.iterdir())
    assert names == sorted(NEEDED), names
    _, mismatch, errors = filecmp.cmpfiles(snapshot, served[names[0]].parent, names, shallow=False)
    assert (mismatch, errors) == ([], [])


def test_launch_downloads_the_model_and_offline_reuses_it(hub, tmp_path: Path, monkeypatch) -> None:
    """``streamrl validate`` fetches config and tokenizer only; ``streamrl launch`` the weights
    (safetensors, not the .bin or ONNX copies), trains on them; offline, the cache serves."""
    home = tmp_path / "hf"
    env = hub_env(hub, home) | {"STREAMRL_HOME": str(tmp_path / "streamrl")}
    overrides = [f"model.name={REPO}", "run.max_steps=2", "eval.every=0", "logging.progress=false"]
    overrides += ["learner.count=1", "generator.count=1"]  # the fewest processes

    checked = _streamrl(env, "validate", "configs/tiny.yaml", *overrides)
    assert checked.returncode == 0, checked.stderr
    assert _resolve_gets(hub) == sorted(NEEDED - {"model.safetensors"})

    done = _streamrl(
        env,
        "launch",
        "configs/tiny.yaml",
        *overrides,
        f"run.output_dir={tmp_path / 'runs'}",
        "--name=hub",
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "done: version 2" in done.stdout
    assert _resolve_gets(hub).count("model.safetensors") == 1  # the rest came from the cache
    assert set(_resolve_gets(hub)) == NEEDED

    # In this process, offline: the same snapshot, byte for byte what the hub serves, and not
    # one request.
    use_hub(monkeypatch, hub, home)
    import huggingface_hub.constants as hconst

    monkeypatch.setattr(hconst, "HF_HUB_OFFLINE", True)
    asked = len(hub.log)
    snapshot = resolve_model(REPO)
    assert snapshot.is_relative_to(home / "hub")
    _same_files(snapshot, hub.files(REPO))
    assert len(hub.log) == asked

    offline = _streamrl(env | {"HF_HUB_OFFLINE": "1"}, "validate", "configs/tiny.yaml", *overrides)
    assert offline.returncode == 0, offline.stderr
    assert len(hub.log) == asked


def test_revision_pins_the_weights(hub, repos, tmp_path: Path, monkeypatch) -> None:
    import torch
    from safetensors.torch import load_file

    use_hub(monkeypatch, hub, tmp_path / "hf")
    main = resolve_model(REPO)
    v2 = resolve_model(REPO, revision="v2")
    assert main != v2
    _same_files(main, hub.files(REPO))
    _same_files(v2, hub.files(REPO, "v2"))
    a, b = load_file(main / "model.safetensors"), load_file(v2 / "model.safetensors")
    assert not any(torch.equal(a[k], b[k]) for k in a)
    sha = hub.repos[REPO].branches["v2"].commit()
    assert resolve_model(REPO, revision=sha) == v2  # a commit pins too

    import huggingface_hub.constants as hconst

    monkeypatch.setattr(hconst, "HF_HUB_OFFLINE", True)
    asked = len(hub.log)
    assert resolve_model(REPO, revision="v2") == v2
    assert resolve_model(REPO) == main
    assert len(hub.log) == asked
    with pytest.raises(ModelNotFoundError, match="not in the local HF cache"):
        resolve_model(REPO, revision="v3")


def _refused(match: str, *args, **kwargs) -> str:
    with pytest.raises(ModelNotFoundError, match=match) as info:
        resolve_model(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message, message
    return message


def test_each_refusal_is_one_line(hub, tmp_path: Path, monkeypatch) -> None:
    use_hub(monkeypatch, hub, tmp_path / "hf")
    _refused(r"has no model repo nobody/nothing \(HTTP 404", "nobody/nothing")
    _refused(r"has no revision 'v9' on .*model\.revision", REPO, revision="v9")
    message = _refused(r"is gated on .*HTTP 401.*set HF_TOKEN", "streamrl-test/gated")
    assert "accept its licence" in message
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    _refused(r"is gated on .*HTTP 403.*set HF_TOKEN", "streamrl-test/gated")
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert (resolve_model("streamrl-test/gated") / "model.safetensors").is_file()
    monkeypatch.delenv("HF_TOKEN")
    message = _refused(r"has no safetensors weights .*pytorch_model\.bin", "streamrl-test/bin-only")
    assert "streamrl loads safetensors only" in message
    assert _resolve_gets(hub, "streamrl-test/bin-only") == []  # refused before downloading
    _refused(
        r"unknown architecture mamba9000: transformers \S+ has no causal LM", "streamrl-test/alien"
    )
    _refused(r"has no tokenizer \(tokenizer\.json", "streamrl-test/mute")
    for refused in ("streamrl-test/alien", "streamrl-test/mute"):  # before the weights
        assert "model.safetensors" not in _resolve_gets(hub, refused)


def test_an_unreachable_hub_falls_back_to_the_cache(hub, tmp_path: Path, monkeypatch) -> None:
    import huggingface_hub.constants as hconst

    use_hub(monkeypatch, hub, tmp_path / "hf")
    snapshot = resolve_model(REPO)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setattr(hconst, "ENDPOINT", dead)
    monkeypatch.setattr(
        hconst, "HUGGINGFACE_CO_URL_TEMPLATE", dead + "/{repo_id}/resolve/{revision}/{filename}"
    )
    assert resolve_model(REPO) == snapshot
    message = _refused(r"is not in the local HF cache .* unreachable", REPO, revision="v2")
    assert dead in message


def test_the_cli_refuses_in_one_line_with_exit_2(hub, tmp_path: Path) -> None:
    offline = hub_env(hub, tmp_path / "empty") | {"HF_HUB_OFFLINE": "1"}
    line = _one_line(_streamrl(offline, "validate", "configs/tiny.yaml", f"model.name={REPO}"))
    assert f"model '{REPO}' is not in the local HF cache" in line and "HF_HUB_OFFLINE=1" in line
    assert hub.log == []

    env = hub_env(hub, tmp_path / "hf") | {"STREAMRL_HOME": str(tmp_path / "streamrl")}
    runs = tmp_path / "runs"
    missing = _streamrl(
        env, "launch", "configs/tiny.yaml", "model.name=nobody/nothing", f"run.output_dir={runs}"
    )
    assert "has no model repo nobody/nothing (HTTP 404" in _one_line(missing)
    assert not runs.exists() or not any(runs.iterdir()), "nothing is written"
