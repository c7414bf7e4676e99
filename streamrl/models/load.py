"""Loading a resolved model directory: its tokenizer, its causal LM, its weights as one bf16
host image."""

from __future__ import annotations

from pathlib import Path


def load_tokenizer(model_dir: Path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(model_dir: Path, dtype: str = "bfloat16", device: str = "cpu"):
    """Load weights from a resolved directory; ``dtype`` is a torch dtype name."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
    head = model.get_output_embeddings()
    if head is not None:
        head.register_forward_pre_hook(_contiguous_inputs)
    return model.to(device)


def load_bf16_image(model_dir: Path) -> dict:
    """Every tensor of the directory's safetensors as contiguous bf16, by checkpoint name: the
    host image a weight subscriber keeps when its engine shares none of its own."""
    import torch
    from safetensors.torch import load_file

    image: dict[str, torch.Tensor] = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        image.update({k: v.to(torch.bfloat16).contiguous() for k, v in load_file(path).items()})
    return image


def _contiguous_inputs(_module, args: tuple) -> tuple:
    """The output head's input made contiguous. ``logits_to_keep`` hands the head a slice of
    the hidden states ([B, keep, H] of [B, T, H]); for such a view without autograd, torch's
    matmul expands the [V, H] weight to [B, H, V] and copies it for a bmm instead of folding
    the batch: 2.6 s against 8 ms for one SmolLM2 prefill at batch 16 (bf16; fp32 0.58 s),
    hit by every prefill, every no-grad learner forward and every reference forward. Copying
    the slice costs B x keep x H elements."""
    return tuple(a.contiguous() if hasattr(a, "contiguous") else a for a in args)
