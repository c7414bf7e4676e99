"""The stand-in hub (tests/hub_server.py) serves what huggingface_hub, transformers and datasets
download: a tiny model, a GSM8K-like dataset with named configs, a gated repo, a missing one;
in this process (``use_hub``) and in a subprocess (``hub_env``)."""

from __future__ import annotations

import contextlib
import filecmp
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hub_server import GSM8K_README, HubServer, hub_env, use_hub

from streamrl.models import resolve_model

pytestmark = pytest.mark.slow

TOKEN = "hf_test_token"


def _server_threads() -> list[threading.Thread]:
    return [
        t
        for t in threading.enumerate()
        if t.name == "hub-server" or "process_request_thread" in t.name
    ]


@pytest.fixture
def serve() -> Iterator:
    """``serve(repos, **kw)`` starts a ``HubServer`` (as a context manager); all are left when
    the test ends, and no thread of theirs may be left running."""
    with contextlib.ExitStack() as stack:
        yield lambda repos, **kwargs: stack.enter_context(HubServer(repos, **kwargs))
    assert _server_threads() == []


def _gets(server: HubServer, suffix: str) -> int:
    return sum(1 for m, path, status in server.log if m == "GET" and path.endswith(suffix))


def test_tiny_model_downloads_and_loads(serve, tmp_path: Path, monkeypatch) -> None:
    import torch
    from huggingface_hub import snapshot_download
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    model_dir = resolve_model("tiny-random-llama")
    hub = serve({"streamrl/tiny-llama": model_dir})
    use_hub(monkeypatch, hub, tmp_path / "hf")

    snapshot = Path(snapshot_download("streamrl/tiny-llama"))
    assert snapshot.is_relative_to(tmp_path / "hf" / "hub")
    names = sorted(p.name for p in model_dir.iterdir())
    assert sorted(p.name for p in snapshot.iterdir()) == names
    match, mismatch, errors = filecmp.cmpfiles(model_dir, snapshot, names, shallow=False)
    assert (mismatch, errors) == ([], [])
    assert _gets(hub, "/model.safetensors") == 1

    AutoConfig.from_pretrained("streamrl/tiny-llama")
    tokenizer = AutoTokenizer.from_pretrained("streamrl/tiny-llama")
    assert tokenizer("abc")["input_ids"]
    model = AutoModelForCausalLM.from_pretrained("streamrl/tiny-llama")
    local = AutoModelForCausalLM.from_pretrained(model_dir)
    for (name, got), (_, want) in zip(
        model.state_dict().items(), local.state_dict().items(), strict=True
    ):
        assert torch.equal(got, want), name
    assert _gets(hub, "/model.safetensors") == 1  # from the cache the second time


def _gsm8k_repo(root: Path) -> dict[str, list[dict[str, str]]]:
    rows = {
        split: [
            {"question": f"{split} question {i}?", "answer": f"step {i}\n#### {i * 7}"}
            for i in range(n)
        ]
        for split, n in (("train", 12), ("test", 5))
    }
    for config in ("main", "socratic"):
        (root / config).mkdir(parents=True)
        for split, split_rows in rows.items():
            table = pa.Table.from_pylist(split_rows if config == "main" else split_rows[:2])
            pq.write_table(table, root / config / f"{split}-00000-of-00001.parquet")
    (root / "README.md").write_text(GSM8K_README)
    return rows


def test_gsm8k_like_dataset_loads_by_config(serve, tmp_path: Path, monkeypatch) -> None:
    import datasets

    rows = _gsm8k_repo(tmp_path / "gsm8k")
    hub = serve({"openai/gsm8k": tmp_path / "gsm8k"}, kinds={"openai/gsm8k": "dataset"})
    use_hub(monkeypatch, hub, tmp_path / "hf")

    train = datasets.load_dataset("openai/gsm8k", "main", split="train")
    assert train.to_list() == rows["train"]
    assert _gets(hub, "/main/train-00000-of-00001.parquet") == 1
    assert str(tmp_path / "hf" / "datasets") in train.cache_files[0]["filename"]
    test = datasets.load_dataset("openai/gsm8k", "main", split="test")
    assert test.to_list() == rows["test"]
    streamed = datasets.load_dataset("openai/gsm8k", "socratic", split="train", streaming=True)
    assert list(streamed) == rows["train"][:2]  # read with range requests (206)
    assert any(status == 206 for _, _, status in hub.log)


def _hub_download(env: dict[str, str], repo_id: str) -> subprocess.CompletedProcess:
    code = (
        "import sys; from huggingface_hub import snapshot_download\n"
        "print(snapshot_download(sys.argv[1]))"
    )
    return subprocess.run(
        [sys.executable, "-c", code, repo_id], env=env, capture_output=True, text=True, timeout=120
    )


def test_gated_repo_needs_the_token(serve, tmp_path: Path, monkeypatch) -> None:
    from huggingface_hub import hf_hub_download, snapshot_download
    from huggingface_hub.errors import GatedRepoError

    repo = tmp_path / "gated"
    (repo / "nested").mkdir(parents=True)
    (repo / "config.json").write_text('{"model_type": "llama"}')
    (repo / "nested" / "weights.bin").write_bytes(bytes(range(256)) * 40)
    hub = serve({"org/gated": repo}, token=TOKEN, gated={"org/gated"})
    use_hub(monkeypatch, hub, tmp_path / "hf")

    with pytest.raises(GatedRepoError):
        snapshot_download("org/gated")
    with pytest.raises(GatedRepoError):
        hf_hub_download("org/gated", "config.json")
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(GatedRepoError):
        hf_hub_download("org/gated", "config.json")
    assert _gets(hub, "/config.json") == 0

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    snapshot = Path(snapshot_download("org/gated"))
    assert (snapshot / "nested" / "weights.bin").read_bytes() == bytes(range(256)) * 40

    # In a subprocess, the environment alone points huggingface_hub at the server.
    refused = _hub_download(hub_env(hub, tmp_path / "hf-sub"), "org/gated")
    assert refused.returncode != 0 and "GatedRepoError" in refused.stderr
    done = _hub_download(hub_env(hub, tmp_path / "hf-sub", token=TOKEN), "org/gated")
    assert done.returncode == 0, done.stderr
    sub_snapshot = Path(done.stdout.strip().splitlines()[-1])
    assert sub_snapshot.is_relative_to(tmp_path / "hf-sub" / "hub")
    assert (sub_snapshot / "config.json").read_text() == '{"model_type": "llama"}'


def test_missing_repo_file_and_revision(serve, tmp_path: Path, monkeypatch) -> None:
    import datasets
    from huggingface_hub import hf_hub_download, snapshot_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    hub = serve({"org/model": tmp_path / "model"})
    use_hub(monkeypatch, hub, tmp_path / "hf")

    with pytest.raises(RepositoryNotFoundError):
        snapshot_download("org/missing")
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("org/missing", "config.json")
    with pytest.raises(RepositoryNotFoundError):  # a model is no dataset
        snapshot_download("org/model", repo_type="dataset")
    with pytest.raises(datasets.exceptions.DatasetNotFoundError):
        datasets.load_dataset("org/missing", split="train")
    with pytest.raises(EntryNotFoundError):
        hf_hub_download("org/model", "absent.json")
    with pytest.raises(RevisionNotFoundError):
        snapshot_download("org/model", revision="v2")
    assert hub.requests["/api/models/org/missing/revision/main"] == 1
