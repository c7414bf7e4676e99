"""LoRA adapters with peft: the adapter a run trains, as every role sees it (docs/design.md §7).

With ``model.lora`` or ``model.adapter`` set the learner trains only low-rank adapters over a
frozen base, the weight stream carries only the adapters, and each generator merges them into
its engine's weights (``LoraMerge``), and the learner computes with the same merged weights
(``workers.learning.lora_forward``).

Version 0 of the adapters is one PEFT adapter directory that every role loads, so that the
learner's image and every generator's are bit-identical from the start, as for full weights:
``<run_dir>/adapter-init``, a copy of ``model.adapter`` or, without one, made by
``write_initial_adapter``: A drawn as peft draws it (Kaiming-uniform, from ``run.seed``),
B = 0 (the model starts as its base), saved in bf16 (the weight stream's dtype).

Wire names are the adapter file's own keys, e.g.
``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``: peft's parameter name
without the adapter's name (``.default``).

Example: ``model.lora: {r: 16}`` on SmolLM2-135M trains 4.9M adapter parameters (210
linear layers); each update streams 4.9M bf16 values instead of 134.5M.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamrl.config import Config, ConfigError
from streamrl.models.load import load_bf16_image

if TYPE_CHECKING:
    import torch

INITIAL_ADAPTER = "adapter-init"  # under the run directory
ADAPTER_NAME = "default"  # peft's name for the one adapter a model holds
ADAPTER_FILE = "adapter_model.safetensors"


@dataclass(frozen=True)
class AdapterSettings:
    """What the adapters are: peft's LoraConfig fields that shape or scale them."""

    r: int
    alpha: float
    target_modules: list[str] | str
    dropout: float = 0.0

    @property
    def scale(self) -> float:
        return self.alpha / self.r


def uses_lora(config: Config) -> bool:
    return config.model.lora is not None or bool(config.model.adapter)


def initial_adapter_dir(run_dir: Path) -> Path:
    return Path(run_dir) / INITIAL_ADAPTER


def adapter_settings(config: Config) -> AdapterSettings:
    """The run's adapter settings: ``model.adapter``'s own (its adapter_config.json) when given,
    which ``model.lora``, if also set, must agree with; else ``model.lora``'s."""
    lora = config.model.lora
    if not config.model.adapter:
        if lora is None:
            raise ConfigError("config error: neither model.lora nor model.adapter is set")
        return AdapterSettings(lora.r, lora.alpha, lora.target_modules, lora.dropout)
    settings = saved_settings(Path(config.model.adapter), lora.dropout if lora else 0.0)
    if lora is not None and (lora.r, lora.alpha) != (settings.r, settings.alpha):
        raise ConfigError(
            f"config error: model.lora (r={lora.r}, alpha={lora.alpha}) disagrees with "
            f"model.adapter {config.model.adapter} (r={settings.r}, alpha={settings.alpha}): "
            "drop model.lora or set it to the adapter's"
        )
    return settings


def saved_settings(adapter_dir: Path, dropout: float = 0.0) -> AdapterSettings:
    """The settings a PEFT adapter directory's adapter_config.json holds."""
    saved = read_adapter_config(adapter_dir)
    return AdapterSettings(
        int(saved["r"]),
        float(saved.get("lora_alpha", saved["r"])),
        saved.get("target_modules") or [],
        dropout,
    )


def read_adapter_config(adapter_dir: Path) -> dict[str, Any]:
    path = adapter_dir / "adapter_config.json"
    if not path.is_file():
        raise ConfigError(f"config error: model.adapter {adapter_dir} has no adapter_config.json")
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"config error: {path}: not valid JSON ({exc})") from None
    if saved.get("peft_type", "LORA") != "LORA" or "r" not in saved:
        raise ConfigError(f"config error: {path}: not a LoRA adapter (peft_type, r)")
    if not (adapter_dir / ADAPTER_FILE).is_file():
        raise ConfigError(f"config error: model.adapter {adapter_dir} has no {ADAPTER_FILE}")
    return saved


def peft_config(settings: AdapterSettings):
    from peft import LoraConfig

    return LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=settings.target_modules,
        bias="none",
        task_type="CAUSAL_LM",
    )


def adapter_shapes(model_dir: Path, settings: AdapterSettings) -> dict[str, tuple[int, ...]]:
    """Wire name -> shape of every adapter tensor, from the base model's architecture on the
    meta device (nothing allocated). One line when the targets reach anything ``LoraMerge``
    cannot merge, or a target name matches nothing (``_unmergeable``)."""
    import torch
    from peft import get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        base = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    linear = _linear_layer_names(base)  # before peft wraps them (in place)
    try:
        model = get_peft_model(base, peft_config(settings))
    except ValueError as exc:  # peft's NoMatchingPeftModuleError among them
        first = str(exc).strip().splitlines()[0]
        raise ConfigError(f"config error: model.lora.target_modules: {first}") from None
    shapes = {
        wire_name(name): tuple(p.shape) for name, p in model.named_parameters() if p.requires_grad
    }
    odd = [n for n in shapes if ".lora_A." not in n and ".lora_B." not in n]
    if odd:  # lora_embedding_A etc.: the generators merge linear layers only
        raise ConfigError(
            f"config error: model.lora.target_modules reaches {odd[0]}: only linear layers "
            "can be adapted (name linear modules, or `all-linear`)"
        )
    why = _unmergeable(model, base, settings.target_modules)
    if why:
        hint = f"{type(base).__name__}'s linear layers: [{', '.join(linear)}]"
        raise ConfigError(f"config error: model.lora.target_modules {why} ({hint})")
    return shapes


def _linear_layer_names(base) -> list[str]:
    """The last names of ``base``'s linear layers, its output head left out."""
    import torch

    head = base.get_output_embeddings()
    return sorted(
        {
            name.rsplit(".", 1)[-1]
            for name, module in base.named_modules()
            if isinstance(module, torch.nn.Linear) and module is not head
        }
    )


def _unmergeable(model, base, targets: list[str] | str) -> str:
    """What of peft ``model``'s adapters (over ``base``) ``LoraMerge`` cannot merge as the
    learner computes them (one 2-D ``<layer>.weight`` of the checkpoint, its own), or "":

    - peft's ``all-linear`` also wraps tensors that are not linear layers (transformers 5
      fuses a MoE block's experts into 3-D tensors; its router is a bare parameter) in a
      ``ParamWrapper``: no checkpoint tensor is ``<layer>.weight``, and the learner's merged
      forward (``workers.learning.lora_forward``) takes linear layers only;
    - an output head tied to the input embeddings shares their tensor in every engine:
      merging B A into it would change the embeddings too, which the learner leaves as
      they are;
    - a name in a target list that matches nothing while others do: peft adapts what
      matches, so Phi-3 (fused ``qkv_proj``) given [q_proj, k_proj, v_proj, o_proj] would
      silently train o_proj alone.

    Example: ``all-linear`` on Qwen3-MoE -> "reaches model.layers.0.mlp.experts
    (Qwen3MoeExperts), which is not a linear layer: ...".
    """
    from peft.tuners.lora.layer import Linear as LoraLinear
    from peft.tuners.lora.layer import LoraLayer

    tied = set(getattr(base, "all_tied_weights_keys", None) or {})
    adapted = {  # peft's outermost wrappers (a nested one's path ends in .base_layer)
        name.removeprefix(_PREFIX): module
        for name, module in model.named_modules()
        if isinstance(module, LoraLayer) and not name.endswith(".base_layer")
    }
    for layer, module in adapted.items():
        if not isinstance(module, LoraLinear):
            kind = type(module.get_base_layer()).__name__
            return (
                f"reaches {layer} ({kind}), which is not a linear layer: the generators "
                "merge linear layers only; name those"
            )
        if f"{layer}.weight" in tied:
            return (
                f"reaches {layer}, whose weight is tied to the input embeddings "
                "(tie_word_embeddings): a merge would change both; leave it out"
            )
    if isinstance(targets, str):  # a regex, or all-linear
        return ""
    unmatched = [t for t in targets if not any(_matches(layer, t) for layer in adapted)]
    if unmatched:
        return f"names {', '.join(unmatched)}, which this model does not have"
    return ""


def _matches(layer: str, target: str) -> bool:
    """peft's rule for a name in a target list: the module's path, or its last parts."""
    return layer == target or layer.endswith(f".{target}")


def wire_name(param_name: str) -> str:
    """peft's parameter name -> the adapter file's key (the adapter's name dropped)."""
    return param_name.replace(f".{ADAPTER_NAME}.", ".")


def check_adapter(config: Config, model_dir: Path) -> AdapterSettings:
    """Before any role starts: the targets name linear layers, and a given adapter fits the
    base model tensor for tensor. Returns the settings."""
    settings = adapter_settings(config)
    shapes = adapter_shapes(model_dir, settings)
    if config.model.adapter:
        saved = _adapter_tensor_shapes(Path(config.model.adapter) / ADAPTER_FILE)
        missing = sorted(set(shapes) - set(saved))
        extra = sorted(set(saved) - set(shapes))
        wrong = sorted(n for n in set(shapes) & set(saved) if shapes[n] != saved[n])
        if missing or extra or wrong:
            name = (wrong or missing or extra)[0]
            what = (
                f"{name} is {saved[name]} in the adapter, {shapes[name]} for this base"
                if wrong
                else f"{name} is {'missing from' if missing else 'extra in'} the adapter"
            )
            raise ConfigError(
                f"config error: model.adapter {config.model.adapter} does not fit base model "
                f"{config.model.name}: {what}"
            )
    return settings


def _adapter_tensor_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118


def write_initial_adapter(config: Config, model_dir: Path, run_dir: Path) -> Path:
    """``<run_dir>/adapter-init``: version 0 of the adapters (module doc). Kept when present
    (a resumed run loads the same bytes again)."""
    out = initial_adapter_dir(run_dir)
    if (out / ADAPTER_FILE).is_file():
        return out
    settings = adapter_settings(config)
    staging = out.with_name(out.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    if config.model.adapter:
        src = Path(config.model.adapter)
        tensors = _load_bf16(src / ADAPTER_FILE)
    else:
        tensors = fresh_adapter(adapter_shapes(model_dir, settings), config.run.seed)
    save_adapter(tensors, settings, str(config.model.name), staging)
    staging.rename(out)
    return out


def fresh_adapter(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, torch.Tensor]:
    """A as peft initialises it (kaiming_uniform_ with a = sqrt(5)), B = 0, in bf16."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name in sorted(shapes):
        shape = shapes[name]
        if ".lora_A." in name:
            bound = 1.0 / math.sqrt(shape[1])  # kaiming_uniform_(a=sqrt(5)) on fan_in
            a = torch.empty(shape).uniform_(-bound, bound, generator=generator)
            tensors[name] = a.to(torch.bfloat16)
        else:
            tensors[name] = torch.zeros(shape, dtype=torch.bfloat16)
    return tensors


def _load_bf16(path: Path) -> dict[str, torch.Tensor]:
    import torch
    from safetensors.torch import load_file

    return {k: v.to(torch.bfloat16).contiguous() for k, v in load_file(path).items()}


def save_adapter(
    tensors: dict[str, torch.Tensor], settings: AdapterSettings, base: str, out: Path
) -> None:
    from safetensors.torch import save_file

    save_file(tensors, str(out / ADAPTER_FILE))
    cfg = peft_config(settings)
    cfg.base_model_name_or_path = base
    cfg.save_pretrained(str(out))


def load_adapter_image(adapter_dir: Path) -> dict[str, torch.Tensor]:
    """The adapters as the weight stream carries them: wire name -> contiguous bf16."""
    return _load_bf16(Path(adapter_dir) / ADAPTER_FILE)


def attach_adapter(model, adapter_dir: Path, settings: AdapterSettings, trainable: bool):
    """``model`` wrapped by peft with the adapters of ``adapter_dir`` (fp32 when trainable:
    they are the optimizer's masters; the base stays in its own dtype and frozen)."""
    from peft import PeftModel

    return PeftModel.from_pretrained(
        model,
        str(adapter_dir),
        is_trainable=trainable,
        config=peft_config(settings),
        autocast_adapter_dtype=trainable,
    )


# --------------------------------------------------------------------------- the merge
# Every engine takes LoRA as full weights through ``Engine.update_weights``, the path full
# fine-tuning uses: a generator keeps the adapted layers' base weights (bf16, as loaded) and
# turns changed adapter tensors into their layers' merged weights, ``W0 + (alpha / r) B A``
# in float32 rounded once to bf16. An update then lands between two decode steps like any
# other (version tags, no aborts), and no engine needs LoRA kernels. vLLM's own LoRA
# (``LoRARequest``) is not used: it loads an adapter per request from disk and keeps it for
# the request's life, so an update could not reach a sequence in flight, and every version
# would be an adapter to load and evict (docs/design.md §7).
#
# Example: the subscriber reports ``...q_proj.lora_B.weight`` changed at version 5;
# ``LoraMerge.merged`` returns ``[("model.layers.0.self_attn.q_proj.weight", W)]``, which the
# engine's ``update_weights(..., version=5)`` takes.

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

    def merge(self, adapters: dict[str, torch.Tensor], layer: str) -> torch.Tensor:
        import torch

        a = adapters[f"{_PREFIX}{layer}.lora_A.weight"]
        b = adapters[f"{_PREFIX}{layer}.lora_B.weight"]
        with torch.no_grad():
            return merged_weight(self.base[layer], a, b, self.scale).to(torch.bfloat16)


def merged_weight(
    base: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float
) -> torch.Tensor:
    """``W0 + scale * B @ A`` in float32: the one merge formula of the generators, the export
    and the learner's forward (``workers.learning.lora_forward``), before the rounding to bf16."""
    return base.float() + scale * (b.float() @ a.float())


def is_adapter_dir(path: Path) -> bool:
    """A PEFT adapter directory (adapter_config.json, no model config.json of its own)."""
    return (path / "adapter_config.json").is_file() and not (path / "config.json").exists()


def adapter_base(adapter_dir: Path) -> str:
    """The base model an adapter directory names (adapter_config.json's
    ``base_model_name_or_path``; streamrl writes its run's ``model.name`` there)."""
    base = read_adapter_config(adapter_dir).get("base_model_name_or_path") or ""
    if not base:
        raise ConfigError(
            f"config error: adapter {adapter_dir} names no base_model_name_or_path in its "
            "adapter_config.json: give the merged model instead (streamrl export --merge)"
        )
    return str(base)


def merged_adapter_dir(adapter_dir: Path, base_dir: Path, store: Path) -> Path:
    """An adapter directory as a model of its own (a teacher from a LoRA run's
    ``adapter/``): its base with the adapters merged in, exactly as every generator merges
    them (``LoraMerge``), in bf16, built once under ``store/merged-<digest of the adapter
    and the base's path>``."""
    import hashlib

    import torch

    from streamrl.models.load import load_causal_lm, load_tokenizer
    from streamrl.models.store import publish_atomically

    digest = hashlib.sha256((adapter_dir / ADAPTER_FILE).read_bytes())
    digest.update(str(base_dir.resolve()).encode())

    def build(out: Path) -> None:
        adapters = load_adapter_image(adapter_dir)
        merged = LoraMerge(base_dir, adapters, saved_settings(adapter_dir)).merged(adapters)
        model = load_causal_lm(base_dir, "bfloat16")
        params = dict(model.named_parameters())
        with torch.no_grad():
            for name, weight in merged:
                params[name].copy_(weight)
        model.config.use_cache = True
        model.save_pretrained(out, safe_serialization=True)
        load_tokenizer(base_dir).save_pretrained(out)

    return publish_atomically(build, store / f"merged-{digest.hexdigest()[:12]}")


def is_base(adapters: dict[str, torch.Tensor]) -> bool:
    """True while every B is zero (a fresh adapter: the engine already holds the base)."""
    return all(not bool(t.any()) for name, t in adapters.items() if ".lora_B." in name)
