"""LoRA's pieces without a run: settings, the checks before any role starts, version 0 of the
adapters, the generators' merge and the learner's merged forward (``streamrl.models.lora``,
``workers.learning.lora_forward``), on the tiny random Llama; the merge and the checks on every
architecture of ``streamrl.models.tiny`` too (Phi-3's fused qkv_proj/gate_up_proj, tied
heads of Qwen2 and Gemma3, Qwen3-MoE's fused experts)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from streamrl.config import ConfigError, load_config
from streamrl.models import TINY, load_causal_lm, resolve_model
from streamrl.models.lora import (
    ADAPTER_FILE,
    AdapterSettings,
    LoraMerge,
    adapter_shapes,
    attach_adapter,
    check_adapter,
    fresh_adapter,
    is_base,
    layer_of,
    load_adapter_image,
    save_adapter,
    uses_lora,
    write_initial_adapter,
)
from streamrl.models.tiny import ARCHITECTURES
from streamrl.workers.learning.lora_forward import merge_in_forward

SETTINGS = AdapterSettings(r=4, alpha=8.0, target_modules="all-linear")
# Qwen3-MoE: all-linear reaches its fused experts, refused (test below); its linear layers.
ATTENTION = AdapterSettings(r=4, alpha=8.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
ARCH_SETTINGS = {"tiny-random-qwen3-moe": ATTENTION}


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return resolve_model(TINY)


def _config(tmp_path: Path, *overrides: str):
    return load_config(None, [f"model.name={TINY}", f"run.output_dir={tmp_path}", *overrides])


def _trained_adapter(
    model_dir: Path, out: Path, seed: int = 0, settings: AdapterSettings = SETTINGS
) -> dict[str, torch.Tensor]:
    adapters = fresh_adapter(adapter_shapes(model_dir, settings), seed)
    gen = torch.Generator().manual_seed(seed + 1)
    for name, tensor in adapters.items():
        if ".lora_B." in name:
            adapters[name] = (0.05 * torch.randn(tensor.shape, generator=gen)).bfloat16()
    out.mkdir(parents=True, exist_ok=True)
    save_adapter(adapters, settings, str(model_dir), out)
    return adapters


def test_all_linear_targets_every_projection_but_the_head(model_dir: Path) -> None:
    shapes = adapter_shapes(model_dir, SETTINGS)
    layers = {layer_of(n) for n in shapes}
    # 2 layers x (q, k, v, o, gate, up, down); the output head is never adapted.
    assert len(layers) == 14 and not any("lm_head" in n for n in layers)
    q = "base_model.model.model.layers.0.self_attn.q_proj"
    assert shapes[f"{q}.lora_A.weight"] == (4, 64) and shapes[f"{q}.lora_B.weight"] == (64, 4)


def test_targets_that_name_nothing_fail_in_one_line(model_dir: Path, tmp_path: Path) -> None:
    config = _config(tmp_path, "model.lora={r: 4, target_modules: [qq_proj]}")
    with pytest.raises(ConfigError, match=r"target_modules.*qq_proj") as err:
        check_adapter(config, model_dir)
    assert "\n" not in str(err.value)


def test_an_adapter_of_another_base_fails_in_one_line(model_dir: Path, tmp_path: Path) -> None:
    other = resolve_model(TINY, tiny_hidden=32)  # same names, other shapes
    adapter = tmp_path / "other"
    adapter.mkdir()
    save_adapter(fresh_adapter(adapter_shapes(other, SETTINGS), 0), SETTINGS, str(other), adapter)
    config = _config(tmp_path, f"model.adapter={adapter}")
    assert uses_lora(config)
    with pytest.raises(ConfigError, match="does not fit base model") as err:
        check_adapter(config, model_dir)
    assert "\n" not in str(err.value)
    # And settings that contradict the adapter's own.
    config = _config(tmp_path, f"model.adapter={adapter}", "model.lora={r: 8}")
    with pytest.raises(ConfigError, match="disagrees"):
        check_adapter(config, other)
    with pytest.raises(ConfigError, match="no adapter_config.json"):
        check_adapter(_config(tmp_path, f"model.adapter={tmp_path}"), model_dir)


def test_version_zero_is_seeded_bf16_with_b_zero(model_dir: Path, tmp_path: Path) -> None:
    config = _config(tmp_path, "model.lora={r: 4, alpha: 8}", "run.seed=3")
    first = write_initial_adapter(config, model_dir, tmp_path / "a")
    second = write_initial_adapter(config, model_dir, tmp_path / "b")
    assert (first / ADAPTER_FILE).read_bytes() == (second / ADAPTER_FILE).read_bytes()
    image = load_adapter_image(first)
    assert all(t.dtype == torch.bfloat16 for t in image.values()) and is_base(image)
    assert any(t.abs().sum() > 0 for n, t in image.items() if ".lora_A." in n)
    saved = json.loads((first / "adapter_config.json").read_text())
    assert (saved["r"], saved["lora_alpha"], saved["base_model_name_or_path"]) == (4, 8, TINY)
    # peft loads it, and the learner's masters start from exactly the image's values.
    model = attach_adapter(load_causal_lm(model_dir), first, SETTINGS, trainable=True)
    trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert len(trained) == len(image)
    for name, param in trained.items():
        assert param.dtype == torch.float32
        assert torch.equal(param.data.bfloat16(), image[name.replace(".default.", ".")])


def test_a_given_adapter_is_version_zero(model_dir: Path, tmp_path: Path) -> None:
    adapters = _trained_adapter(model_dir, tmp_path / "given")
    config = _config(tmp_path, f"model.adapter={tmp_path / 'given'}")
    check_adapter(config, model_dir)
    out = write_initial_adapter(config, model_dir, tmp_path / "run")
    image = load_adapter_image(out)
    assert image.keys() == adapters.keys() and not is_base(image)
    assert all(torch.equal(image[n], adapters[n]) for n in image)


@pytest.mark.parametrize("arch", [TINY, *ARCHITECTURES])
def test_merge_equals_peft_merge_and_the_learner_forward(arch: str, tmp_path: Path) -> None:
    """On every architecture: each adapted layer merges into a tensor of the checkpoint
    (Phi-3's fused qkv_proj and gate_up_proj whole), as peft merges it, and the learner's
    forward computes with exactly the generators' merged weights (a tied head's embeddings
    untouched)."""
    model_dir, settings = resolve_model(arch), ARCH_SETTINGS.get(arch, SETTINGS)
    adapters = _trained_adapter(model_dir, tmp_path / "a", settings=settings)
    layers = {layer_of(n) for n in adapters}
    merged = dict(LoraMerge(model_dir, adapters, settings).merged(adapters))
    assert merged.keys() == {f"{layer}.weight" for layer in layers}
    assert all(t.dtype == torch.bfloat16 for t in merged.values())
    # peft's own merge, in float32 then rounded once, lands on the same bf16 weights (up to
    # float32 summation order: at most one bf16 step apart, almost all equal).
    model = attach_adapter(load_causal_lm(model_dir, "float32"), tmp_path / "a", settings, False)
    reference = model.merge_and_unload().state_dict()
    equal = total = 0
    for name, weight in merged.items():
        ref = reference[name].bfloat16()
        step = (ref.float().abs() * 2**-7).clamp_min(2**-126)
        assert ((weight.float() - ref.float()).abs() <= step).all(), name
        equal += int((weight == ref).sum())
        total += weight.numel()
    assert equal / total > 0.99
    # The learner's forward computes with exactly the generators' merged weights.
    ids = torch.tensor([[1, 20, 30, 40, 50, 60] * 4])  # past Gemma3's window of 16
    learner = attach_adapter(load_causal_lm(model_dir), tmp_path / "a", settings, False)
    assert merge_in_forward(learner) == len(layers) > 0
    engine = load_causal_lm(model_dir)
    embeddings = engine.get_input_embeddings().weight.detach().clone()
    missing, unexpected = engine.load_state_dict(merged, strict=False)
    assert unexpected == [] and len(missing) == len(engine.state_dict()) - len(merged)
    assert torch.equal(engine.get_input_embeddings().weight, embeddings)  # head untouched
    with torch.no_grad():
        torch.testing.assert_close(learner(input_ids=ids).logits, engine(input_ids=ids).logits)


@pytest.mark.parametrize(
    ("arch", "targets", "reason"),
    [
        # transformers 5 fuses the experts into 3-D tensors; peft's all-linear wraps them.
        (
            "tiny-random-qwen3-moe",
            "all-linear",
            r"reaches model\.layers\.0\.mlp\.experts \(Qwen3MoeExperts\), which is not a linear "
            r"layer.*\[k_proj, o_proj, q_proj, v_proj\]",
        ),
        ("tiny-random-qwen3-moe", ["gate"], r"reaches model\.layers\.0\.mlp\.gate \("),
        ("tiny-random-gemma3", ["q_proj", "lm_head"], r"reaches lm_head, whose weight is tied"),
        ("tiny-random-qwen2", ["lm_head"], r"reaches lm_head, whose weight is tied"),
        (
            "tiny-random-phi3",
            ["q_proj", "k_proj", "v_proj", "o_proj"],
            r"names q_proj, k_proj, v_proj, which this model does not have.*qkv_proj",
        ),
    ],
)
def test_targets_the_generators_cannot_merge_fail_in_one_line(
    arch: str, targets: list[str] | str, reason: str, tmp_path: Path
) -> None:
    """Before any role starts, not in a generator's first merge (``adapted layer ... is not
    in``), nor silently: Phi-3 given q/k/v/o would train o_proj alone."""
    value = targets if isinstance(targets, str) else f"[{', '.join(targets)}]"
    config = load_config(
        None,
        [
            f"model.name={arch}",
            f"run.output_dir={tmp_path}",
            f"model.lora={{r: 4, target_modules: {value}}}",
        ],
    )
    with pytest.raises(ConfigError, match=reason) as err:
        check_adapter(config, resolve_model(arch))
    assert "\n" not in str(err.value)


def test_the_merged_forward_trains_a_and_b_only(model_dir: Path, tmp_path: Path) -> None:
    adapters = _trained_adapter(model_dir, tmp_path / "a")
    model = attach_adapter(load_causal_lm(model_dir), tmp_path / "a", SETTINGS, True)
    merge_in_forward(model)
    ids = torch.tensor([[1, 20, 30, 40, 50, 60]])
    model(input_ids=ids).logits.float().logsumexp(-1).sum().backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert grads and all(".lora_A." in n or ".lora_B." in n for n in grads)
    assert len(grads) == len(adapters)
    assert all(g.abs().sum() > 0 for g in grads.values())


def test_merged_linear_gradients_are_lora_s() -> None:
    """For a loss linear in y (gY fixed), A's and B's gradients through the merged forward
    equal those of ``x (W + s B A)^T`` by autograd: the rounding is passed straight through."""
    from streamrl.workers.learning.lora_forward import _MergedLinear

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 16, generator=gen)
    base = torch.randn(12, 16, generator=gen).bfloat16()
    a = torch.randn(4, 16, generator=gen, requires_grad=True)
    b = torch.randn(12, 4, generator=gen, requires_grad=True)
    g = torch.randn(3, 5, 12, generator=gen)
    (_MergedLinear.apply(x, base, None, a, b, 2.0) * g).sum().backward()
    ours = a.grad.clone(), b.grad.clone()
    a.grad = b.grad = None
    (torch.nn.functional.linear(x, base.float() + 2.0 * b @ a) * g).sum().backward()
    torch.testing.assert_close(ours[0], a.grad)
    torch.testing.assert_close(ours[1], b.grad)
