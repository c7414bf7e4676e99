"""A generator's LoRA: the adapters the weight stream carries, merged into its engine's weights.

Every engine takes LoRA the same way: as full weights through ``Engine.update_weights``, the
path full fine-tuning uses, merged here as ``W = W0 + (alpha / r) * B @ A`` in float32 and
rounded once to bf16 (the image dtype). So an update lands between two decode steps like any
other (version tags, no aborts), and no engine needs LoRA kernels. vLLM's own LoRA
(``LoRARequest``) is not used: it loads an adapter per request from disk and keeps it for the
request's life, so an update could not reach a sequence in flight, and every version would be
a new adapter to load and evict (docs/design.md §7).

The subscriber's image holds the adapters (wire names, ``streamrl.lora``); this class keeps
the base weights of the adapted layers (bf16, as loaded) and turns changed adapter tensors into
the merged weights of their layers.

Example: the subscriber reports ``...q_proj.lora_B.weight`` changed at version 5; ``merged``
returns ``[("model.layers.0.self_attn.q_proj.weight", W0 + s * B @ A)]``, and the engine's
``update_weights(..., version=5)`` takes it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

from streamrl.lora import AdapterSettings
from streamrl.models import load_bf16_image

_PREFIX = "base_model.model."  # peft's wrapper path before the base model's own names


def layer_of(wire: str) -> str:
    """``base_model.model.X.lora_A.weight`` -> ``X`` (the adapted layer's module path)."""
    body = wire.removeprefix(_PREFIX)
    for part in (".lora_A.", ".lora_B."):
        if part in body:
            return body.split(part)[0]
    raise ValueError(f"{wire}: not a LoRA A/B tensor name")


class LoraMerge:
    """Merged weights of the adapted layers from the adapter image (see module doc)."""

    def __init__(
        self, model_dir: Path, adapters: dict[str, torch.Tensor], settings: AdapterSettings
    ) -> None:
        self.scale = settings.scale
        self.layers = sorted({layer_of(name) for name in adapters})
        base = load_bf16_image(model_dir)
        missing = [f"{layer}.weight" for layer in self.layers if f"{layer}.weight" not in base]
        if missing:
            raise ValueError(f"adapted layer {missing[0]} is not in {model_dir}")
        # Only the adapted layers' base weights are kept; the rest of the image is dropped.
        self.base = {layer: base[f"{layer}.weight"] for layer in self.layers}

    def merged(
        self, adapters: dict[str, torch.Tensor], changed: Iterable[str] | None = None
    ) -> list[tuple[str, torch.Tensor]]:
        """(checkpoint name, merged bf16 weight) of every layer an adapter tensor in
        ``changed`` belongs to (None: every adapted layer), from the adapter image."""
        layers = self.layers if changed is None else sorted({layer_of(n) for n in changed})
        return [(f"{layer}.weight", self.merge(adapters, layer)) for layer in layers]

    @torch.no_grad()
    def merge(self, adapters: dict[str, torch.Tensor], layer: str) -> torch.Tensor:
        a = adapters[f"{_PREFIX}{layer}.lora_A.weight"].float()
        b = adapters[f"{_PREFIX}{layer}.lora_B.weight"].float()
        weight = self.base[layer].float().addmm_(b, a, alpha=self.scale)
        return weight.to(torch.bfloat16)


def is_base(adapters: dict[str, torch.Tensor]) -> bool:
    """True while every B is zero (a fresh adapter: the engine already holds the base)."""
    return all(not bool(t.any()) for name, t in adapters.items() if ".lora_B." in name)
