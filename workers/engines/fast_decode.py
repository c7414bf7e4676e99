"""One decode step of a Llama-family model, without transformers' per-layer Python overhead.

A decode step is one token per row through every layer: the matmuls are small and the step is
bound by streaming the weights and by the framework's per-op cost. transformers' layers spend
~45 ops and several Python frames per layer on a step (mask building, attention dispatch, cache
bookkeeping, a norm in six ops), ~10 here. SmolLM2 at batch 16, bf16, 2 threads (Intel Xeon,
AVX512 + AMX): 39-44 ms per decode step through ``model(...)``, 35-36 ms through
``FastDecoder``; ``benchmarks/generator.py`` 386 -> 464 tok/s (``--no-fast-decode`` compares).

``FastDecoder.step`` computes what ``model(input_ids=tokens[:, None], attention_mask,
position_ids, past_key_values, logits_to_keep=1)`` computes, from the model's own modules and
weights (so in-flight weight updates apply to it too), for models whose layers are exactly
Llama's: RMSNorm -> attention (rotary, grouped-query, optional q/k/v bias) -> residual ->
RMSNorm -> gated MLP -> residual. It differs from the reference by rounding only (fused
norm, merged projections): the engine's logprobs are still those of the distribution it
samples from, and the learner's recomputation matches them to noise level (DESIGN §5b).

Where the engine's linear layers are prepacked for oneDNN, q/k/v and gate/up each run as one
matmul over a merged packed copy (one pass over the input, one call instead of three or two);
``merged_by_param`` names the merged copies to rebuild when a version changes a weight. The
prefill, which runs through transformers' modules, reads the same merged copies
(``MergedProjection.member_output``): the separate layers keep no packed copy of their own, so
each weight is packed once per version, not twice.

Prefill stays on ``model(...)``: it is compute-bound, so per-op overhead barely matters there,
and transformers' masks handle left padding over many positions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from streamrl.workers.engines.packed_linear import PackedLinear, PackedWeight

# model_type -> decoder layers that are exactly Llama's (checked module by module below too).
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
_NORM_CLASSES = ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm")


class MergedProjection:
    """Linear layers of one input (q, k, v or gate, up), their outputs concatenated in
    ``groups`` (lists of layer indices, in order): one merged packed matmul split by group
    when the layers are all prepacked, else each layer in turn."""

    def __init__(self, layers: list[torch.nn.Module], groups: list[list[int]]) -> None:
        self.layers = layers
        self.groups = groups
        self.member_widths = [_linear(layer).out_features for layer in layers]
        self.widths = [sum(self.member_widths[i] for i in group) for group in groups]
        self.packed: torch.Tensor | None = None
        self.bias: torch.Tensor | None = None
        self.weights: PackedWeight | None = None
        # The prefill's last input and its members' outputs (``member_output``).
        self._input: torch.Tensor | None = None
        self._outputs: list[torch.Tensor] = []
        self._taken: set[int] = set()
        if all(isinstance(layer, PackedLinear) for layer in layers):
            self.weights = PackedWeight([s.weight.detach() for s in self.sources], layers[0].rows)
            self.adopt((self.weights.current, self._bias({})))
            for index, layer in enumerate(layers):
                layer.share(self, index)

    @property
    def sources(self) -> list[torch.nn.Linear]:
        return [_linear(layer) for layer in self.layers]

    def repack(self) -> None:
        self.adopt(self.pack({}))

    def pack(self, new: dict[int, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The merged packed weight and bias, each source parameter ``p`` taken from
        ``new[id(p)]`` where given (a version not adopted yet, packed on the weight thread)."""
        assert self.weights is not None, "only a merged copy of packed layers is packed"
        weights = [new.get(id(s.weight), s.weight.detach()) for s in self.sources]
        return self.weights.pack(weights), self._bias(new)

    def _bias(self, new: dict[int, torch.Tensor]) -> torch.Tensor | None:
        sources = self.sources
        if all(s.bias is None for s in sources):
            return None
        weight = sources[0].weight
        return torch.cat(
            [
                weight.new_zeros(s.out_features) if s.bias is None else new.get(id(s.bias), s.bias)
                for s in sources
            ]
        ).detach()

    def adopt(self, packed: tuple[torch.Tensor, torch.Tensor | None]) -> None:
        if self.weights is not None:
            self.weights.adopt(packed[0])
        self.packed, self.bias = packed

    def member_output(self, index: int, x: torch.Tensor) -> torch.Tensor:
        """Layer ``index``'s output for ``x``, for the prefill, which runs transformers'
        modules one projection at a time: the first member asked computes the merged matmul,
        the others take their columns of it (for the same input tensor), and the outputs are
        let go once every member took its own. So the separate layers keep no packed copy of
        their own, and a version repacks each weight once, not twice."""
        if x is not self._input or index in self._taken:
            flat = x.reshape(-1, x.shape[-1])
            y = torch.ops.mkldnn._linear_pointwise(flat, self.packed, self.bias, "none", [], "")
            self._input, self._taken = x, set()
            self._outputs = list(y.split(self.member_widths, dim=-1))
        out = self._outputs[index]
        self._taken.add(index)
        if len(self._taken) == len(self.layers):
            self._input, self._outputs = None, []
        return out.contiguous().reshape(*x.shape[:-1], out.shape[-1])

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        if self.packed is None:
            outputs = [layer(x) for layer in self.layers]
            return [torch.cat([outputs[i] for i in group], dim=-1) for group in self.groups]
        y = torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return list(y.split(self.widths, dim=-1))


def _linear(layer: torch.nn.Module) -> torch.nn.Linear:
    return layer.source if isinstance(layer, PackedLinear) else layer


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why ``FastDecoder`` cannot run this model (``None``: it can)."""
    config = model.config
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        return f"model_type {config.model_type!r} is not one of {SUPPORTED_MODEL_TYPES}"
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if getattr(config, "sliding_window", None) or layer_types != {"full_attention"}:
        return "sliding-window attention"  # its cache keeps a window, not every column
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "rotary_emb") or not hasattr(model, "lm_head"):
        return "no model.model.rotary_emb / lm_head"
    for norm in [inner.norm] + [n for layer in inner.layers for n in _norms(layer)]:
        if type(norm).__name__ not in _NORM_CLASSES:
            return f"norm {type(norm).__name__} is not an RMSNorm of a supported model"
    for layer in inner.layers:
        attn = layer.self_attn
        if getattr(attn, "sliding_window", None) or hasattr(attn, "q_norm"):
            return "sliding-window or q/k-normed attention in a layer"
        if not all(hasattr(attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj", "scaling")):
            return "attention without q/k/v/o projections"
        if not all(hasattr(layer.mlp, n) for n in ("gate_proj", "up_proj", "down_proj", "act_fn")):
            return "MLP is not gated"
    return None


def _norms(layer: torch.nn.Module) -> list[torch.nn.Module]:
    return [layer.input_layernorm, layer.post_attention_layernorm]


class _Layer:
    def __init__(self, layer: torch.nn.Module) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.input_norm, self.post_norm = _norms(layer)
        # q and k together (one rotary pass for both), v apart; gate and up apart.
        self.qk_v = MergedProjection([attn.q_proj, attn.k_proj, attn.v_proj], [[0, 1], [2]])
        self.gate_up = MergedProjection([mlp.gate_proj, mlp.up_proj], [[0], [1]])
        self.query_heads = _linear(attn.q_proj).out_features // attn.head_dim
        self.o_proj, self.down_proj, self.act = attn.o_proj, mlp.down_proj, mlp.act_fn
        self.head_dim, self.scaling = attn.head_dim, attn.scaling


def rms_norm(x: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor:
    """transformers' Llama RMSNorm: normalise in float32, round to the input's dtype, scale.
    torch's kernel normalises a bf16 input in float32 and rounds once, so this is bit-equal
    (tests/unit/test_fast_decode.py) in one op instead of six."""
    return norm.weight * F.rms_norm(x, (x.shape[-1],), eps=norm.variance_epsilon)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class FastDecoder:
    """Decode steps of ``model`` (see the module docstring); build it after prepacking."""

    def __init__(self, model: torch.nn.Module, params: dict[str, torch.Tensor]) -> None:
        """``params``: the model's parameters by the names weight updates use (as
        ``named_parameters`` gave them before prepacking moved them into ``PackedLinear``s)."""
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"FastDecoder cannot run this model: {reason}")
        self.model = model
        self.inner = model.model
        self.layers = [_Layer(layer) for layer in self.inner.layers]
        names = {id(p): name for name, p in params.items()}
        # Per parameter name, the merged copies built from it (to ``repack`` when it changes).
        self.merged_by_param: dict[str, list[MergedProjection]] = {}
        for layer in self.layers:
            for group in (layer.qk_v, layer.gate_up):
                if group.packed is None:
                    continue
                for source in group.sources:
                    for p in (source.weight, source.bias):
                        if p is not None:
                            self.merged_by_param.setdefault(names[id(p)], []).append(group)

    @torch.no_grad()
    def step(
        self, tokens: torch.Tensor, attention: torch.Tensor, positions: torch.Tensor, cache
    ) -> torch.Tensor:
        """tokens [B], attention [B, T] (0 = padding, the new token's column included),
        positions [B] -> next-token logits [B, V]; appends each layer's key/value to
        ``cache`` (a ``DynamicCache`` of full-attention layers)."""
        rows = tokens.shape[0]
        x = self.inner.embed_tokens(tokens)  # [B, H]
        cos, sin = self.inner.rotary_emb(x, positions[:, None])  # [B, 1, D]
        cos, sin = cos[:, None], sin[:, None]  # [B, 1, 1, D]: broadcast over heads
        # Boolean key mask, or none when no row is padded (SDPA's fastest path).
        mask = None if bool(attention.all()) else attention.bool()[:, None, None, :]
        for index, layer in enumerate(self.layers):
            qk, v = layer.qk_v(rms_norm(x, layer.input_norm))
            d = layer.head_dim
            qk = _rotate(qk.view(rows, -1, 1, d), cos, sin)  # [B, Hq + Hkv, 1, D]
            q, k = qk[:, : layer.query_heads], qk[:, layer.query_heads :]
            keys, values = cache.update(k, v.view(rows, -1, 1, d), index)  # [B, Hkv, T, D]
            # Grouped-query attention as one query head per key/value head, its group's
            # queries as that head's query positions (no causal mask: all see every key).
            # Same result as SDPA's enable_gqa to rounding, at half its cost on a CPU
            # (SmolLM2, batch 16: 59 vs 121 us; batch 64: 244 vs 499 us).
            grouped = q.view(rows, keys.shape[1], -1, d)  # [B, Hkv, Hq / Hkv, D]
            out = F.scaled_dot_product_attention(
                grouped, keys, values, attn_mask=mask, scale=layer.scaling
            )
            x = x + layer.o_proj(out.reshape(rows, -1))
            gate, up = layer.gate_up(rms_norm(x, layer.post_norm))
            x = x + layer.down_proj(layer.act(gate) * up)
        return self.model.lm_head(rms_norm(x, self.inner.norm))
