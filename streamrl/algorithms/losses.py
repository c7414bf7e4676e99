"""Policy and value losses, loss aggregation and memory-safe logit reductions.

Everything here is a pure function of tensors: no I/O, no host syncs (metrics come back as 0-dim
tensors for the learner to reduce once per step). Names picked by the config live in two
registries: ``AGGREGATIONS`` (how a ``[B,T]`` loss becomes a scalar) and ``CORRECTIONS`` (the
off-policy weight applied to each token's loss). ``token_logprobs`` and ``entropy`` are chunked
autograd functions, so that the learner never holds a second full ``[B,T,V]`` float32 tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

__all__ = [
    "AGGREGATIONS",
    "CORRECTIONS",
    "aggregate",
    "entropy",
    "policy_loss",
    "token_entropy",
    "distill_topk",
    "token_logprobs",
    "tokens_logprobs",
    "value_loss",
]

# exp(20) ~ 5e8: never binds in healthy training, and keeps every ratio and gradient finite.
LOG_RATIO_CLAMP = 20.0


def _lookup(registry: Mapping[str, Callable[..., Any]], name: str, what: str) -> Callable[..., Any]:
    try:
        return registry[name]
    except KeyError:
        raise ValueError(f"unknown {what} {name!r}; choose from {sorted(registry)}") from None


def _zeros_where_masked(x: Tensor, keep: Tensor) -> Tensor:
    # where() and not x * mask: an inf or NaN in a padded slot must not leak into the sum.
    return torch.where(keep, x, torch.zeros_like(x))


def _masked_mean(x: Tensor, keep: Tensor) -> Tensor:
    return _zeros_where_masked(x, keep).sum() / keep.sum().clamp(min=1).to(x.dtype)


def _masked_frac(condition: Tensor, keep: Tensor) -> Tensor:
    return _masked_mean(condition.float(), keep)


# ---------------------------------------------------------------------------------------------
# Aggregation: [B,T] -> scalar.


def _token_mean(x: Tensor, keep: Tensor, norm_length: float | None) -> tuple[Tensor, Tensor]:
    return _zeros_where_masked(x, keep).sum(), keep.sum().to(x.dtype)


def _per_sequence(per_seq: Tensor, keep: Tensor) -> tuple[Tensor, Tensor]:
    has_tokens = keep.any(dim=-1)
    return _zeros_where_masked(per_seq, has_tokens).sum(), has_tokens.sum().to(per_seq.dtype)


def _seq_mean_token_mean(
    x: Tensor, keep: Tensor, norm_length: float | None
) -> tuple[Tensor, Tensor]:
    counts = keep.sum(dim=-1).clamp(min=1).to(x.dtype)
    return _per_sequence(_zeros_where_masked(x, keep).sum(dim=-1) / counts, keep)


def _seq_mean_token_sum(
    x: Tensor, keep: Tensor, norm_length: float | None
) -> tuple[Tensor, Tensor]:
    return _per_sequence(_zeros_where_masked(x, keep).sum(dim=-1), keep)


def _seq_mean_token_sum_norm(
    x: Tensor, keep: Tensor, norm_length: float | None
) -> tuple[Tensor, Tensor]:
    length = float(x.shape[-1]) if norm_length is None else float(norm_length)
    return _per_sequence(_zeros_where_masked(x, keep).sum(dim=-1) / length, keep)


# Config name -> (x[B,T], keep[B,T] bool, norm_length) -> (numerator, default denominator).
AGGREGATIONS: dict[str, Callable[[Tensor, Tensor, float | None], tuple[Tensor, Tensor]]] = {
    "token-mean": _token_mean,
    "seq-mean-token-mean": _seq_mean_token_mean,
    "seq-mean-token-sum": _seq_mean_token_sum,
    "seq-mean-token-sum-norm": _seq_mean_token_sum_norm,
}


def aggregate(
    x: Tensor,
    mask: Tensor,
    mode: str,
    *,
    norm_length: float | None = None,
    denominator: Tensor | float | None = None,
) -> Tensor:
    """Reduce a per-token loss ``x[B,T]`` with ``mask[B,T]`` (bool or 0/1) to a scalar ``Tensor[]``.

    - ``token-mean``: sum_{b,t} m x / sum_{b,t} m. Every token weighs the same, so long sequences
      weigh more in total (DAPO's choice, arXiv 2503.14476).
    - ``seq-mean-token-mean``: mean over sequences of (sum_t m x / sum_t m). Every sequence weighs
      the same; a token of a long response weighs less (original GRPO, arXiv 2402.03300), which
      is the length bias Dr.GRPO points out.
    - ``seq-mean-token-sum``: mean over sequences of sum_t m x.
    - ``seq-mean-token-sum-norm``: mean over sequences of sum_t m x / ``norm_length`` (default
      ``T``), a constant that removes the length bias (Dr.GRPO, arXiv 2503.20783). verl divides
      the sum over sequences by ``T``; here it is the mean over sequences, which only rescales.

    "Sequences" are rows with at least one masked-in token, so an empty row never counts and an
    all-zero mask gives 0, never NaN. ``denominator``, when given, replaces the count (of tokens
    for ``token-mean``, of sequences otherwise): pass the global count so that the losses of
    micro-batches sum to the loss of the whole batch. It must be > 0.
    """
    keep = mask.to(torch.bool)
    numerator, count = _lookup(AGGREGATIONS, mode, "loss aggregation")(x, keep, norm_length)
    if denominator is None:
        return numerator / count.clamp(min=1)
    return numerator / denominator


# ---------------------------------------------------------------------------------------------
# Off-policy corrections: weights from rho = pi_proximal / pi_behavior, never differentiated.


def _ratio(log_ratio: Tensor) -> Tensor:
    return log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()


def _no_correction(log_rho: Tensor, keep: Tensor, is_cap: float, is_low: float) -> Tensor:
    return torch.ones_like(log_rho)


def _token_tis(log_rho: Tensor, keep: Tensor, is_cap: float, is_low: float) -> Tensor:
    return _ratio(log_rho).clamp(max=is_cap)


def _seq_tis(log_rho: Tensor, keep: Tensor, is_cap: float, is_low: float) -> Tensor:
    seq_ratio = _ratio(log_rho.sum(dim=-1, keepdim=True)).clamp(max=is_cap)
    return seq_ratio.expand_as(log_rho)


def _in_band(ratio: Tensor, is_cap: float, is_low: float) -> Tensor:
    return ((ratio >= is_low) & (ratio <= is_cap)).to(ratio.dtype)


def _token_mask(log_rho: Tensor, keep: Tensor, is_cap: float, is_low: float) -> Tensor:
    return _in_band(_ratio(log_rho), is_cap, is_low)


def _seq_mask(log_rho: Tensor, keep: Tensor, is_cap: float, is_low: float) -> Tensor:
    # Geometric mean of the per-token ratio, so one band works for any response length.
    tokens = keep.sum(dim=-1, keepdim=True).clamp(min=1).to(log_rho.dtype)
    geo_ratio = _ratio(log_rho.sum(dim=-1, keepdim=True) / tokens)
    return _in_band(geo_ratio, is_cap, is_low).expand_as(log_rho)


# Config name -> (log_rho[B,T] zero where masked out, keep[B,T], is_cap, is_low) -> w[B,T].
CORRECTIONS: dict[str, Callable[[Tensor, Tensor, float, float], Tensor]] = {
    "none": _no_correction,
    "token-tis": _token_tis,
    "seq-tis": _seq_tis,
    "token-mask": _token_mask,
    "seq-mask": _seq_mask,
}


def policy_loss(
    logprobs: Tensor,
    proximal_logprobs: Tensor,
    behavior_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    correction: str = "token-tis",
    is_cap: float = 2.0,
    is_low: float | None = None,
    agg: str = "token-mean",
    norm_length: float | None = None,
    agg_denominator: Tensor | float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped surrogate with a decoupled off-policy correction; returns ``(loss[], metrics)``.

    Shapes: ``logprobs``, ``proximal_logprobs``, ``behavior_logprobs``, ``mask`` are ``[B,T]``;
    ``advantages`` is ``[B,T]`` or ``[B]`` (broadcast over ``T``). Only ``logprobs`` is
    differentiated; the other inputs are detached.

        r   = exp(clamp(logp - logp_prox, -20, 20))
        L   = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))       PPO, Schulman et al. 2017
        L   = min(L, -A c)  where A < 0, if dual_clip = c > 1           Ye et al. 2020 (dual-clip)
        L  *= w(rho),  rho = exp(clamp(logp_prox - logp_behav, -20, 20)), w without gradient
        loss = aggregate(L, mask, agg)

    ``clip_high > clip_low`` is DAPO's clip-higher (arXiv 2503.14476). The correction ``w``:

    - ``none``: 1.
    - ``token-tis``: min(rho_t, is_cap), truncated importance sampling per token (Yao et al.
      2025, "Your efficient RL framework secretly brings you off-policy RL training").
    - ``seq-tis``: min(exp(clamp(sum_t m (logp_prox - logp_behav), -20, 20)), is_cap), one
      weight per sequence.
    - ``token-mask``: 1 if is_low <= rho_t <= is_cap else 0 (IcePop, Ring team 2025): tokens whose
      generator and learner probabilities disagree too much are dropped, not down-weighted.
    - ``seq-mask``: the same band applied to the per-sequence geometric mean
      exp(mean_t m (logp_prox - logp_behav)), dropping whole sequences. The geometric mean
      (not the product used by ``seq-tis``) keeps one band meaningful for every length: a
      product over 1,000 tokens leaves any band after a tiny per-token drift.

    ``is_low`` defaults to ``1 / is_cap``. With ``proximal_logprobs`` recomputed by the learner at
    the start of the step this is AReaL's decoupled PPO (Fu et al. 2025, arXiv 2505.24298): the
    trust region is centred on recent weights while ``w`` corrects for the stale generator.
    With proximal = behavior ("bypass": no recompute pass), rho = 1 and ``w = 1``.

    Metrics (0-dim tensors, no gradient), over masked-in tokens:
    ``policy/clipfrac_upper`` (A > 0 and r > 1 + clip_high: gradient cut by the upper clip),
    ``policy/clipfrac_lower`` (A < 0 and r < 1 - clip_low), ``policy/dualclip_frac`` (the dual
    clip bound is the loss), ``policy/approx_kl`` (k3 estimate of KL(pi_prox || pi), r - 1 -
    log r), ``policy/is_weight_mean``, ``policy/is_weight_max``, ``policy/is_masked_frac``
    (share of tokens with w == 0), ``policy/offpolicy_k3`` (k3 estimate of KL(pi_behav ||
    pi_prox)) and ``policy/is_ess`` (effective sample size fraction of rho; 1 on policy).
    """
    dtype = torch.promote_types(logprobs.dtype, torch.float32)
    logprobs = logprobs.to(dtype)
    proximal = proximal_logprobs.detach().to(dtype)
    behavior = behavior_logprobs.detach().to(dtype)
    adv = advantages.detach().to(dtype)
    adv = (adv.unsqueeze(-1) if adv.dim() == logprobs.dim() - 1 else adv).expand_as(logprobs)
    keep = mask.to(torch.bool)

    log_ratio = (logprobs - proximal).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = log_ratio.exp()
    clipped_ratio = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(-adv * ratio, -adv * clipped_ratio)
    dual_active = torch.zeros_like(keep)
    if dual_clip is not None:
        dual_bound = -adv * dual_clip
        dual_active = (adv < 0) & (per_token > dual_bound)
        per_token = torch.where(dual_active, dual_bound, per_token)

    log_rho = _zeros_where_masked(proximal - behavior, keep)
    low = 1.0 / is_cap if is_low is None else is_low
    with torch.no_grad():
        weight = _lookup(CORRECTIONS, correction, "correction")(log_rho, keep, is_cap, low)
    loss = aggregate(
        per_token * weight, keep, agg, norm_length=norm_length, denominator=agg_denominator
    )

    with torch.no_grad():
        ratio, log_ratio = ratio.detach(), log_ratio.detach()
        bounded = log_rho.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        metrics = {
            "policy/clipfrac_upper": _masked_frac((adv > 0) & (ratio > 1 + clip_high), keep),
            "policy/clipfrac_lower": _masked_frac((adv < 0) & (ratio < 1 - clip_low), keep),
            "policy/dualclip_frac": _masked_frac(dual_active, keep),
            "policy/approx_kl": _masked_mean(ratio - 1 - log_ratio, keep),
            "policy/is_weight_mean": _masked_mean(weight, keep),
            "policy/is_weight_max": _zeros_where_masked(weight, keep).amax(),
            "policy/is_masked_frac": _masked_frac(weight == 0, keep),
            # How far the generator's weights were from the proximal ones, whatever the
            # correction: k3 of KL(pi_behav || pi_prox) (r - 1 - log r with r = rho, the
            # tokens sampled from pi_behav) and the tokens' effective sample size fraction
            # (sum rho)^2 / (n sum rho^2), 1 on policy. The staleness tuner's guard.
            "policy/offpolicy_k3": _masked_mean(bounded.exp() - 1 - bounded, keep),
            "policy/is_ess": _ess_fraction(bounded, keep),
        }
    return loss, metrics


def _ess_fraction(log_rho: Tensor, keep: Tensor) -> Tensor:
    rho = _zeros_where_masked(log_rho.exp(), keep)
    n = keep.sum().clamp(min=1).to(rho.dtype)
    return rho.sum() ** 2 / (n * (rho**2).sum()).clamp(min=1e-30)


def value_loss(
    values: Tensor,
    returns: Tensor,
    old_values: Tensor,
    mask: Tensor,
    *,
    clip: float,
    agg: str = "token-mean",
    norm_length: float | None = None,
    agg_denominator: Tensor | float | None = None,
) -> Tensor:
    """Clipped value loss (PPO, Schulman et al. 2017, as in OpenAI baselines); returns ``Tensor[]``.

    Shapes: ``values``, ``returns``, ``old_values``, ``mask`` are ``[B,T]``; only ``values`` is
    differentiated.

        v_clip = clip(v, v_old - clip, v_old + clip)
        L      = 1/2 max((v - R)^2, (v_clip - R)^2),   aggregated with ``agg``
    """
    returns, old_values = returns.detach(), old_values.detach()
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    per_token = 0.5 * torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)
    return aggregate(per_token, mask, agg, norm_length=norm_length, denominator=agg_denominator)


# ---------------------------------------------------------------------------------------------
# Chunked reductions over the vocabulary. Autograd saves only the logits (which exist anyway)
# and one or two floats per row; the softmax is recomputed chunk by chunk in backward, in place,
# so the peak extra memory is about two [rows, V] blocks in the compute dtype.

# Elements per chunk when chunk_size is None: 2**25 float32 = 128 MiB per temporary block.
CHUNK_ELEMENTS = 2**25


def _compute_dtype(logits: Tensor) -> torch.dtype:
    # bf16/fp16 logits are reduced in float32; float64 stays float64 (gradcheck in tests).
    return torch.promote_types(logits.dtype, torch.float32)


def _chunks(logits: Tensor, chunk_size: int | None) -> tuple[Tensor, list[slice]]:
    """The logits as ``[B*T, V]`` rows and the row slices to process one at a time."""
    flat = logits.reshape(-1, logits.shape[-1])
    rows = chunk_size if chunk_size is not None else max(1, CHUNK_ELEMENTS // flat.shape[1])
    if rows < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    return flat, [slice(start, start + rows) for start in range(0, flat.shape[0], rows)]


def _scaled(block: Tensor, dtype: torch.dtype, temperature: float) -> Tensor:
    """A fresh copy of ``block / temperature`` in ``dtype`` (safe to modify in place)."""
    return block.to(dtype) / temperature


def _log_probs_(z: Tensor, lse: Tensor) -> Tensor:
    # In place: z - lse. A -inf logit becomes the most negative finite float, so that
    # p * log p = 0 * (-big) = 0 instead of 0 * -inf = NaN; NaN logits still propagate.
    return z.sub_(lse.unsqueeze(-1)).clamp_(min=torch.finfo(z.dtype).min)


class _TokenLogprobs(torch.autograd.Function):
    """Chosen tokens' logprobs and, ``with_entropy``, each row's entropy from the same
    softmax per chunk, forward and backward (the policy step needs both of the same logits,
    and each pass over the vocabulary is a [rows, V] float32 sweep). Without it the entropy
    output is empty."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        logits: Tensor,
        tokens: Tensor,
        chunk_size: int | None,
        temperature: float,
        with_entropy: bool,
    ) -> tuple[Tensor, Tensor]:
        flat, chunks = _chunks(logits, chunk_size)
        # One token per row ([B, T]) or k per row ([B, T, k]: ``tokens_logprobs``).
        per_row = 1 if tokens.dim() < logits.dim() else tokens.shape[-1]
        flat_tokens = tokens.reshape(flat.shape[0], per_row).long()  # k may be 0: entropy only
        dtype = _compute_dtype(logits)
        out = torch.empty((flat.shape[0], per_row), dtype=dtype, device=logits.device)
        lse = torch.empty(flat.shape[0], dtype=dtype, device=logits.device)
        ent = torch.empty(flat.shape[0] if with_entropy else 0, dtype=dtype, device=lse.device)
        for rows in chunks:
            z = _scaled(flat[rows], dtype, temperature)
            lse[rows] = torch.logsumexp(z, dim=-1)
            out[rows] = z.gather(1, flat_tokens[rows]) - lse[rows, None]
            if with_entropy:
                logp = _log_probs_(z, lse[rows])
                ent[rows] = -(logp.exp() * logp).sum(dim=-1)
        ctx.save_for_backward(logits, flat_tokens, lse, ent)
        ctx.chunk_size, ctx.temperature = chunk_size, temperature
        ctx.set_materialize_grads(False)  # an output the loss does not use costs nothing
        shape = logits.shape[:-1] if with_entropy else (0,)
        return out.view(tokens.shape), ent.view(shape)

    @staticmethod
    @once_differentiable
    def backward(  # type: ignore[override]
        ctx, grad_logprobs: Tensor | None, grad_entropy: Tensor | None
    ) -> tuple[Tensor, None, None, None, None]:
        # d logp_y / dz_j = ([j == y] - p_j) / tau, summed over a row's tokens y; and
        # dH / dz_j = -p_j (log p_j + H) / tau
        logits, flat_tokens, lse, ent = ctx.saved_tensors
        flat, chunks = _chunks(logits, ctx.chunk_size)
        grad_ent = None
        if grad_entropy is not None and ent.numel():
            grad_ent = grad_entropy.reshape(-1, 1).to(lse.dtype)
        elif grad_logprobs is None:  # neither output reached the loss
            grad_logprobs = torch.zeros(flat_tokens.shape, dtype=lse.dtype, device=lse.device)
        grad_rows = None
        if grad_logprobs is not None:
            grad_rows = grad_logprobs.reshape(flat_tokens.shape).to(lse.dtype)
            grad_sums = grad_rows.sum(-1, keepdim=True)
        grad = torch.empty_like(flat)
        for rows in chunks:
            logp = _log_probs_(_scaled(flat[rows], lse.dtype, ctx.temperature), lse[rows])
            if grad_ent is None:
                g = logp.exp_().mul_(-grad_sums[rows])
            else:  # p (log p + H) first: a banned token's 0 x (most negative float) is 0
                probs = logp.exp()
                g = logp.add_(ent[rows, None]).mul_(probs).mul_(-grad_ent[rows])
                if grad_rows is not None:
                    g.addcmul_(probs, grad_sums[rows], value=-1.0)
            if grad_rows is not None:
                g.scatter_add_(1, flat_tokens[rows], grad_rows[rows])
            grad[rows] = g.div_(ctx.temperature)
        return grad.view_as(logits), None, None, None, None


def token_logprobs(
    logits: Tensor,
    tokens: Tensor,
    *,
    chunk_size: int | None = None,
    temperature: float = 1.0,
) -> Tensor:
    """Log-probabilities of chosen tokens: ``logits[B,T,V]``, ``tokens[B,T]`` -> ``Tensor[B,T]``.

        logp_t = z_t[y_t] / tau - logsumexp(z_t / tau)

    Computed in float32 (float64 for float64 logits) over ``chunk_size`` rows of ``B*T`` at a
    time (default: as many rows as fit ``CHUNK_ELEMENTS``), so the extra memory is a couple of
    ``[chunk_size, V]`` blocks, never a second ``[B,T,V]`` tensor; dividing by the sampling
    temperature ``tau`` happens inside the chunk for the same reason. Autograd saves only
    ``logits`` and one float per row and recomputes the softmax chunk by chunk in backward.
    Differentiable in ``logits`` (first order only); the gradient has the dtype of ``logits``.
    """
    return _TokenLogprobs.apply(logits, tokens, chunk_size, temperature, False)[0]


def tokens_logprobs(
    logits: Tensor,
    tokens: Tensor,
    *,
    chunk_size: int | None = None,
    temperature: float = 1.0,
) -> Tensor:
    """``token_logprobs`` of k tokens per position: ``logits[B,T,V]``, ``tokens[B,T,k]`` ->
    ``Tensor[B,T,k]`` (a teacher's top-k tokens, ``distill_topk``), one logsumexp per row."""
    if tokens.dim() != logits.dim():
        raise ValueError(f"tokens must be [B, T, k] for logits {tuple(logits.shape)}")
    return _TokenLogprobs.apply(logits, tokens, chunk_size, temperature, False)[0]


def distill_topk(student: Tensor, teacher: Tensor) -> Tensor:
    """The forward KL from a teacher to the student over the teacher's top-k tokens, per
    position: ``student[B,T,k]``, ``teacher[B,T,k]`` (logprobs of the same k tokens) ->
    ``Tensor[B,T]``.

        L_t = sum_{v in top-k} q(v) (log q(v) - log p(v))

    Its gradient in the student's logits is ``(sum_k q) p - q`` on the top-k: a supervised
    pull toward the teacher's distribution at every prefix the student wrote (GKD's forward
    KL, Agarwal et al. 2024, arXiv 2306.13649), which stays strong where the student is sure
    of a token the teacher is not, where the sampled-token reverse KL's gradient fades.
    The tail beyond the top-k is left out (its mass is what ``sum_k q`` misses).
    """
    q = teacher.exp()
    # A slot with no teacher token (logprob -inf, q = 0) adds 0, not 0 * inf.
    terms = torch.where(q > 0, q * (teacher - student), torch.zeros_like(student))
    return terms.sum(-1)


def token_logprobs_and_entropy(
    logits: Tensor,
    tokens: Tensor,
    *,
    chunk_size: int | None = None,
    temperature: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """``(token_logprobs(...), token_entropy(...))`` of the same logits from one chunked
    softmax, forward and backward: ``tokens`` [B, T] (or [B, T, k], as ``tokens_logprobs``)
    -> ([B, T] or [B, T, k], [B, T]). Equal to the two calls; differentiable in ``logits``
    through either output or both."""
    return _TokenLogprobs.apply(logits, tokens, chunk_size, temperature, True)


def token_entropy(
    logits: Tensor, *, chunk_size: int | None = None, temperature: float = 1.0
) -> Tensor:
    """Per-token entropy ``H_t = -sum_v p_v log p_v``: ``logits[B,T,V]`` -> ``Tensor[B,T]``.

    Chunked like ``token_logprobs`` (no second ``[B,T,V]`` tensor); differentiable in ``logits``.
    A ``-inf`` logit (a banned token) contributes 0, not NaN.
    """
    no_tokens = torch.empty((*logits.shape[:-1], 0), dtype=torch.long, device=logits.device)
    return _TokenLogprobs.apply(logits, no_tokens, chunk_size, temperature, True)[1]


def entropy(
    logits: Tensor,
    mask: Tensor,
    *,
    chunk_size: int | None = None,
    temperature: float = 1.0,
    agg: str = "token-mean",
) -> Tensor:
    """Policy entropy over masked-in tokens: ``logits[B,T,V]``, ``mask[B,T]`` -> ``Tensor[]``.

    Default aggregation is the masked token mean. Subtract ``coef * entropy`` from the loss for an
    entropy bonus; differentiable in ``logits``.
    """
    per_token = token_entropy(logits, chunk_size=chunk_size, temperature=temperature)
    return aggregate(per_token, mask, agg)
