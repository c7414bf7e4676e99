"""How ``model.name`` resolves (streamrl/models/) without a hub: the checks of a model
directory, which names are hub ids, which hub files are fetched, and a ``.gguf`` file's cache.
The hub itself is tests/integration/test_hub_model.py's."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from streamrl import models
from streamrl.models import ModelNotFoundError, check_model, check_model_dir, hub, resolve_model
from streamrl.models import gguf as gguf_source


def _model_dir(path: Path, config: dict, *tokenizer_files: str) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    for name in tokenizer_files:
        (path / name).write_text("{}")
    return path


def _one_line(match: str, call, *args, **kwargs) -> str:
    with pytest.raises(ModelNotFoundError, match=match) as info:
        call(*args, **kwargs)
    assert "\n" not in str(info.value), str(info.value)
    return str(info.value)


def test_a_known_causal_lm_with_a_tokenizer_passes(tmp_path: Path) -> None:
    check_model_dir(_model_dir(tmp_path / "a", {"model_type": "llama"}, "tokenizer.json"))
    check_model_dir(_model_dir(tmp_path / "b", {"model_type": "qwen2"}, "tokenizer_config.json"))
    # No model_type: the architectures name a causal LM class; a sentencepiece model suffices.
    check_model_dir(
        _model_dir(tmp_path / "c", {"architectures": ["LlamaForCausalLM"]}, "tokenizer.model")
    )


@pytest.mark.parametrize(
    ("config", "arch"),
    [
        ({"model_type": "mamba9000", "architectures": ["Mamba9000ForCausalLM"]}, "mamba9000"),
        ({"model_type": "t5"}, "t5"),  # known to transformers, but no causal LM
        ({"architectures": ["SomethingElse"]}, "SomethingElse"),
        ({}, "(config.json names none)"),
    ],
)
def test_an_unknown_architecture_is_one_line(tmp_path: Path, config: dict, arch: str) -> None:
    import transformers

    path = _model_dir(tmp_path / "m", config, "tokenizer.json")
    message = _one_line("unknown architecture", check_model_dir, path)
    assert message == (
        f"model directory {path}: unknown architecture {arch}: transformers "
        f"{transformers.__version__} has no causal LM for it"
    )
    # resolve_model checks a local directory the same way, before anything loads it.
    _one_line(re.escape(f"unknown architecture {arch}:"), resolve_model, str(path))


def test_no_tokenizer_or_no_config_is_one_line(tmp_path: Path) -> None:
    path = _model_dir(tmp_path / "m", {"model_type": "llama"}, "vocab.json")
    message = _one_line("has no tokenizer", check_model_dir, path)
    assert message.startswith(f"model directory {path} has no tokenizer (tokenizer.json, ")
    _one_line("has no tokenizer", resolve_model, str(path))
    (path / "config.json").unlink()
    _one_line(f"model directory {path} has no config.json", check_model_dir, path)
    (path / "config.json").write_text("{not json")
    _one_line("config.json is unreadable", check_model_dir, path)
    _one_line(r"model 'org/x' \(", check_model_dir, path, name="org/x")


@pytest.mark.parametrize(
    ("name", "is_id"),
    [
        ("HuggingFaceTB/SmolLM2-135M-Instruct", True),
        ("google/gemma-3-270m", True),
        ("org/model.v1_b", True),
        ("org/model/extra", False),
        ("/abs/path", False),
        ("./rel/path", False),
        ("../up/model", False),
        ("org/a..b", False),
        ("org/a--b", False),
        ("model", False),
        ("org/", False),
    ],
)
def test_what_is_a_hub_id(name: str, is_id: bool) -> None:
    assert models.is_hub_id(name) is is_id


def test_the_hub_files_a_causal_lm_needs() -> None:
    files = [
        ".gitattributes",
        "README.md",
        "config.json",
        "generation_config.json",
        "model.safetensors.index.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "consolidated.safetensors",  # Mistral's second copy of the weights
        "pytorch_model.bin.index.json",
        "pytorch_model-00001-of-00002.bin",
        "tf_model.h5",
        "flax_model.msgpack",
        "model.gguf",
        "onnx/model.onnx",
        "original/params.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "tokenizer.model",
        "merges.txt",
        "vocab.json",
        "chat_template.jinja",
    ]
    tokenizer_and_config = [
        "chat_template.jinja",
        "config.json",
        "generation_config.json",
        "merges.txt",
        "model.safetensors.index.json",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer.model",
        "tokenizer_config.json",
        "vocab.json",
    ]
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert hub.hub_files("o/m", files, None, weights=True) == sorted(tokenizer_and_config + shards)
    assert hub.hub_files("o/m", files, None, weights=False) == tokenizer_and_config
    # Safetensors under other names: all of the top level's.
    assert hub.hub_files("o/m", ["config.json", "weights.safetensors"], None, True) == [
        "config.json",
        "weights.safetensors",
    ]
    message = _one_line(
        "has no safetensors weights",
        hub.hub_files,
        "o/m",
        ["config.json", "pytorch_model.bin", "sub/model.safetensors"],
        "v1",
        True,
    )
    assert message.startswith("model 'o/m' (revision 'v1') has no safetensors weights on the hub")
    assert "(it has pytorch_model.bin)" in message and "safetensors only" in message


def test_a_gguf_file_converts_once_per_version(tmp_path: Path, monkeypatch) -> None:
    converted: list[Path] = []

    def convert(gguf: Path, out: Path) -> None:
        converted.append(gguf)
        (out / "config.json").write_text('{"model_type": "llama"}')
        (out / "tokenizer.json").write_text(gguf.read_text())

    monkeypatch.setattr(gguf_source, "convert_gguf", convert)
    monkeypatch.setenv("STREAMRL_HOME", str(tmp_path / "home"))
    gguf = tmp_path / "My-Model.Q4_K_M.gguf"
    gguf.write_text("v1")
    first = resolve_model(str(gguf))
    assert first.parent == tmp_path / "home" / "models"
    assert first.name.startswith("gguf-My-Model.Q4_K_M-")
    assert resolve_model(str(gguf)) == first and len(converted) == 1
    gguf.write_text("v2 of it")  # another size and mtime: converted anew
    os.utime(gguf, ns=(1, 1))
    second = resolve_model(str(gguf))
    assert second != first and (second / "tokenizer.json").read_text() == "v2 of it"
    assert len(converted) == 2

    _one_line("no such .gguf file", resolve_model, str(tmp_path / "absent.gguf"))

    def fail(gguf: Path, out: Path) -> None:
        raise ValueError("GGUF model with architecture\nfoo is not supported yet.")

    monkeypatch.setattr(gguf_source, "convert_gguf", fail)
    gguf.write_text("v3, longer still")
    message = _one_line("transformers cannot convert this GGUF", resolve_model, str(gguf))
    assert message.endswith("GGUF model with architecture foo is not supported yet.")
    assert sorted((tmp_path / "home" / "models").iterdir()) == sorted([first, second])


def test_what_is_not_a_model(tmp_path: Path) -> None:
    message = _one_line("not found", resolve_model, "no-such-model")
    assert message.startswith("model 'no-such-model' not found: not a local directory, not a")
    assert "tiny-random-llama" in message  # the built-ins are listed
    _one_line("model '/no/such/model' not found", resolve_model, "/no/such/model")


def test_validate_checks_paths_but_builds_nothing(tmp_path: Path) -> None:
    check_model("tiny-random-llama")  # the built-ins are the launch's to build
    check_model("smollm2-135m-instruct")
    check_model(str(_model_dir(tmp_path / "ok", {"model_type": "llama"}, "tokenizer.json")))
    bare = _model_dir(tmp_path / "m", {"model_type": "llama"}, "x")
    _one_line("has no tokenizer", check_model, str(bare))
    _one_line("no such .gguf file", check_model, str(tmp_path / "absent.gguf"))
    _one_line("model '/no/such/model' not found", check_model, "/no/such/model")


def _tiny_gguf(path: Path, tokens: list[str]) -> Path:
    """A GGUF file holding a vocabulary and no tensors (what GGUFReader parses slowly)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_token_list(tokens)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_conversion_parses_each_gguf_file_once(tmp_path: Path) -> None:
    """transformers builds a ``gguf.GGUFReader`` for the config, the tokenizer and the weights
    in turn; during one conversion they get the same reader per file, and afterwards the
    module's own class is back."""
    import gguf

    original = gguf.GGUFReader
    a = _tiny_gguf(tmp_path / "a.gguf", ["<s>", "a", "b"])
    b = _tiny_gguf(tmp_path / "b.gguf", ["<s>", "c"])
    with gguf_source._one_reader_per_file():
        first = gguf.GGUFReader(a)
        assert gguf.GGUFReader(str(a)) is first and gguf.GGUFReader(b) is not first
        assert isinstance(first, original)
        tokens = first.fields["tokenizer.ggml.tokens"]
        assert [bytes(tokens.parts[i]).decode() for i in tokens.data] == ["<s>", "a", "b"]
    assert gguf.GGUFReader is original
    assert gguf.GGUFReader(a) is not first  # a fresh parse outside a conversion


def _publish_slowly(target: str, log: str) -> None:
    from streamrl.models.store import publish_atomically

    def build(out: Path) -> None:
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(1.0)
        (out / "config.json").write_text("{}")

    publish_atomically(build, Path(target))


def test_two_processes_asking_for_one_model_build_it_once(tmp_path: Path) -> None:
    """The second waits for the first's copy rather than converting the model again."""
    import multiprocessing

    target, log = tmp_path / "models" / "m", tmp_path / "builds.txt"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_publish_slowly, args=(str(target), str(log))) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert len(log.read_text().split()) == 1 and (target / "config.json").is_file()
    assert [p.name for p in target.parent.iterdir()] == ["m"]  # no staging copy left
