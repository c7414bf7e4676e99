"""Losses against float64 plain-Python references: aggregation, policy/value loss, logit ops."""

from __future__ import annotations

import math

import pytest
import torch

from streamrl.algorithms import losses

Matrix = list[list[float]]
AGGS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
CORRECTIONS = ["none", "token-tis", "seq-tis", "token-mask", "seq-mask"]


# ------------------------------------------------------------------ references


def ref_agg_coeffs(mask: list[list[int]], mode: str, norm_length: float | None) -> Matrix:
    """d loss / d x[b][t] for each mode: the aggregation is linear in x."""
    rows = len(mask)
    tokens = sum(sum(row) for row in mask)
    seqs = sum(1 for row in mask if sum(row) > 0)
    out = [[0.0] * len(row) for row in mask]
    for b in range(rows):
        n = sum(mask[b])
        for t, m in enumerate(mask[b]):
            if not m:
                continue
            if mode == "token-mean":
                out[b][t] = 1 / tokens
            elif mode == "seq-mean-token-mean":
                out[b][t] = 1 / (n * seqs)
            elif mode == "seq-mean-token-sum":
                out[b][t] = 1 / seqs
            else:
                out[b][t] = 1 / ((norm_length or len(mask[b])) * seqs)
    return out


def ref_aggregate(x: Matrix, mask: list[list[int]], mode: str, norm_length: float | None) -> float:
    coeffs = ref_agg_coeffs(mask, mode, norm_length)
    return sum(
        c * v
        for c_row, x_row in zip(coeffs, x, strict=True)
        for c, v in zip(c_row, x_row, strict=True)
        if c
    )


def clamp(v: float, lo: float, hi: float) -> float:
    return min(max(v, lo), hi)


def ref_weights(
    prox: Matrix, beh: Matrix, mask: list[list[int]], correction: str, cap: float, low: float
) -> Matrix:
    out = []
    for p_row, b_row, m_row in zip(prox, beh, mask, strict=True):
        deltas = [p - b for p, b, m in zip(p_row, b_row, m_row, strict=True) if m]
        seq_sum = sum(deltas)
        geo = seq_sum / max(len(deltas), 1)
        row = []
        for p, b in zip(p_row, b_row, strict=True):
            rho = math.exp(clamp(p - b, -20, 20))
            row.append(
                {
                    "none": 1.0,
                    "token-tis": min(rho, cap),
                    "seq-tis": min(math.exp(clamp(seq_sum, -20, 20)), cap),
                    "token-mask": float(low <= rho <= cap),
                    "seq-mask": float(low <= math.exp(clamp(geo, -20, 20)) <= cap),
                }[correction]
            )
        out.append(row)
    return out


def ref_policy(
    lp: Matrix,
    prox: Matrix,
    beh: Matrix,
    adv: Matrix,
    mask: list[list[int]],
    *,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None,
    correction: str,
    is_cap: float,
    agg: str,
) -> tuple[float, Matrix, dict[str, float]]:
    """Loss, d loss / d logprobs, metrics; w is a constant."""
    weights = ref_weights(prox, beh, mask, correction, is_cap, 1 / is_cap)
    coeffs = ref_agg_coeffs(mask, agg, None)
    per_token, grads = [], []
    counts = dict.fromkeys(["up", "low", "dual", "kl", "w", "masked", "k3", "rho", "rho2"], 0.0)
    w_max, n = 0.0, 0
    for b in range(len(lp)):
        loss_row, grad_row = [], []
        for t in range(len(lp[b])):
            delta = lp[b][t] - prox[b][t]
            log_ratio = clamp(delta, -20, 20)
            r = math.exp(log_ratio)
            a, w = adv[b][t], weights[b][t]
            unclipped = -a * r
            clipped = -a * clamp(r, 1 - clip_low, 1 + clip_high)
            loss = max(unclipped, clipped)
            grad = -a * r if unclipped >= clipped and abs(delta) <= 20 else 0.0
            dual = dual_clip is not None and a < 0 and loss > -a * dual_clip
            if dual:
                loss, grad = -a * dual_clip, 0.0
            loss_row.append(loss * w)
            grad_row.append(grad * w * coeffs[b][t])
            if mask[b][t]:
                n += 1
                counts["up"] += a > 0 and r > 1 + clip_high
                counts["low"] += a < 0 and r < 1 - clip_low
                counts["dual"] += dual
                counts["kl"] += r - 1 - log_ratio
                counts["w"] += w
                counts["masked"] += w == 0
                w_max = max(w_max, w)
                log_rho = clamp(prox[b][t] - beh[b][t], -20, 20)
                counts["k3"] += math.exp(log_rho) - 1 - log_rho
                counts["rho"] += math.exp(log_rho)
                counts["rho2"] += math.exp(log_rho) ** 2
        per_token.append(loss_row)
        grads.append(grad_row)
    n = max(n, 1)
    metrics = {
        "policy/clipfrac_upper": counts["up"] / n,
        "policy/clipfrac_lower": counts["low"] / n,
        "policy/dualclip_frac": counts["dual"] / n,
        "policy/approx_kl": counts["kl"] / n,
        "policy/is_weight_mean": counts["w"] / n,
        "policy/is_weight_max": w_max,
        "policy/is_masked_frac": counts["masked"] / n,
        "policy/offpolicy_k3": counts["k3"] / n,
        "policy/is_ess": counts["rho"] ** 2 / (n * counts["rho2"]) if counts["rho2"] else 0.0,
    }
    return ref_aggregate(per_token, mask, agg, None), grads, metrics


def random_policy_batch(seed: int, b: int = 5, t: int = 8) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    prox = randn(b, t) - 2
    lp = prox + 0.4 * randn(b, t)
    beh = prox - 0.5 * randn(b, t)
    # Extreme log-ratios in both the trust-region ratio and the correction ratio.
    lp[0, 1], lp[1, 2] = prox[0, 1] + 50, prox[1, 2] - 50
    beh[2, 0], beh[3, 3] = prox[2, 0] + 50, prox[3, 3] - 50
    mask = (torch.rand(b, t, generator=gen) > 0.25).long()
    mask[0, 1] = mask[1, 2] = mask[2, 0] = mask[3, 3] = 1
    mask[4] = 0  # an empty row
    mask[1, -2:] = 0  # padding
    adv = randn(b, t).round(decimals=1)
    return {"lp": lp, "prox": prox, "beh": beh, "adv": adv, "mask": mask}


def assert_scalar(got: torch.Tensor, expected: float) -> None:
    torch.testing.assert_close(got.double(), torch.tensor(expected, dtype=torch.float64))


# ------------------------------------------------------------------ aggregate


@pytest.mark.parametrize("mode", AGGS)
@pytest.mark.parametrize("seed", range(3))
def test_aggregate_matches_reference(mode: str, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(6, 7, generator=gen, dtype=torch.float64)
    mask = (torch.rand(6, 7, generator=gen) > 0.4).long()
    mask[2] = 0
    mask[0, :] = 1
    expected = ref_aggregate(x.tolist(), mask.tolist(), mode, None)
    assert_scalar(losses.aggregate(x, mask, mode), expected)
    assert_scalar(losses.aggregate(x, mask.bool(), mode), expected)
    expected_norm = ref_aggregate(x.tolist(), mask.tolist(), mode, 32)
    assert_scalar(losses.aggregate(x, mask, mode, norm_length=32), expected_norm)


@pytest.mark.parametrize("mode", AGGS)
def test_aggregate_empty_mask_is_zero_and_gradient_finite(mode: str) -> None:
    x = torch.randn(3, 4, requires_grad=True)
    out = losses.aggregate(x, torch.zeros(3, 4), mode)
    out.backward()
    assert out.item() == 0.0
    assert torch.equal(x.grad, torch.zeros(3, 4))


@pytest.mark.parametrize("mode", AGGS)
def test_aggregate_ignores_non_finite_padding(mode: str) -> None:
    x = torch.tensor([[1.0, 2.0, float("nan")], [3.0, float("inf"), -float("inf")]])
    x.requires_grad_(True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    out = losses.aggregate(x, mask, mode)
    out.backward()
    assert torch.isfinite(out) and torch.isfinite(x.grad).all()
    assert_scalar(out, ref_aggregate([[1, 2, 0], [3, 0, 0]], mask.tolist(), mode, None))


def test_aggregate_hand_computed_and_length_bias() -> None:
    x = torch.tensor([[1.0, 1.0, 1.0, 1.0], [4.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])
    assert losses.aggregate(x, mask, "token-mean").item() == pytest.approx(8 / 5)
    assert losses.aggregate(x, mask, "seq-mean-token-mean").item() == pytest.approx(2.5)
    assert losses.aggregate(x, mask, "seq-mean-token-sum").item() == pytest.approx(4.0)
    assert losses.aggregate(x, mask, "seq-mean-token-sum-norm").item() == pytest.approx(1.0)


def test_aggregate_global_denominator_sums_micro_batches() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, 5, generator=gen)
    mask = torch.rand(6, 5, generator=gen) > 0.3
    whole = losses.aggregate(x, mask, "token-mean")
    total = mask.sum()
    parts = sum(
        losses.aggregate(x[i : i + 2], mask[i : i + 2], "token-mean", denominator=total)
        for i in range(0, 6, 2)
    )
    torch.testing.assert_close(parts, whole)


def test_unknown_names_raise() -> None:
    with pytest.raises(ValueError, match="token-mean"):
        losses.aggregate(torch.zeros(1, 1), torch.ones(1, 1), "mean")
    z = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="token-tis"):
        losses.policy_loss(z, z, z, z, z, correction="tis")


def test_registries() -> None:
    assert list(losses.AGGREGATIONS) == AGGS
    assert list(losses.CORRECTIONS) == CORRECTIONS


# ------------------------------------------------------------------ policy loss


@pytest.mark.parametrize("correction", CORRECTIONS)
@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("dual_clip", [None, 3.0])
def test_policy_loss_matches_reference(correction: str, agg: str, dual_clip: float | None) -> None:
    batch = random_policy_batch(seed=len(correction) + len(agg))
    lp = batch["lp"].clone().requires_grad_(True)
    prox = batch["prox"].clone().requires_grad_(True)
    beh = batch["beh"].clone().requires_grad_(True)
    adv = batch["adv"].clone().requires_grad_(True)
    kwargs = {"clip_low": 0.2, "clip_high": 0.28, "dual_clip": dual_clip, "correction": correction}
    loss, metrics = losses.policy_loss(
        lp, prox, beh, adv, batch["mask"], is_cap=2.0, agg=agg, **kwargs
    )
    loss.backward()
    expected, grads, expected_metrics = ref_policy(
        *(batch[k].tolist() for k in ("lp", "prox", "beh", "adv", "mask")),
        is_cap=2.0,
        agg=agg,
        **kwargs,
    )
    assert_scalar(loss, expected)
    torch.testing.assert_close(lp.grad, torch.tensor(grads, dtype=torch.float64))
    # Only logprobs are differentiated: not the proximal/behavior logprobs (w), not advantages.
    assert prox.grad is None and beh.grad is None and adv.grad is None
    assert set(metrics) == set(expected_metrics)
    for name, value in metrics.items():
        assert value.dim() == 0 and not value.requires_grad, name
        assert value.item() == pytest.approx(expected_metrics[name], rel=1e-5, abs=1e-6), name


@pytest.mark.parametrize("correction", CORRECTIONS)
def test_policy_loss_extremes_are_finite_in_float32(correction: str) -> None:
    batch = random_policy_batch(seed=7)
    lp = batch["lp"].float().requires_grad_(True)
    prox = batch["prox"].float()
    beh = batch["beh"].float()
    # Padding as it may arrive off the wire: -inf proximal, NaN behavior logprobs.
    pad = batch["mask"] == 0
    prox[pad], beh[pad] = -float("inf"), float("nan")
    adv = batch["adv"].float() * 1e3
    loss, metrics = losses.policy_loss(
        lp, prox, beh, adv, batch["mask"], correction=correction, dual_clip=3.0
    )
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.isfinite(lp.grad).all()
    assert all(torch.isfinite(v) for v in metrics.values())


def test_policy_loss_hand_computed_clip() -> None:
    # r = 1.5 with A = +1: clipped at 1.2 -> L = -1.2. r = 0.5 with A = -1: clipped at 0.8 -> 0.8.
    lp = torch.log(torch.tensor([[1.5, 0.5]])).requires_grad_(True)
    zeros = torch.zeros(1, 2)
    loss, metrics = losses.policy_loss(
        lp, zeros, zeros, torch.tensor([[1.0, -1.0]]), torch.ones(1, 2), correction="none"
    )
    loss.backward()
    assert loss.item() == pytest.approx((-1.2 + 0.8) / 2)
    assert torch.equal(lp.grad, torch.zeros(1, 2))  # both clipped: no gradient
    assert metrics["policy/clipfrac_upper"].item() == pytest.approx(0.5)
    assert metrics["policy/clipfrac_lower"].item() == pytest.approx(0.5)


def test_policy_loss_hand_computed_unclipped_and_dual_clip() -> None:
    # Token 1: r = 1.1, A = 2, inside the clip range -> L = -2.2, dL/dlogp = -2.2.
    # Token 2: r = 5, A = -1: PPO gives 5, dual clip c = 3 caps it at 3 with no gradient.
    lp = torch.log(torch.tensor([[1.1, 5.0]])).requires_grad_(True)
    zeros = torch.zeros(1, 2)
    adv = torch.tensor([2.0, -1.0]).unsqueeze(0)
    loss, metrics = losses.policy_loss(
        lp, zeros, zeros, adv, torch.ones(1, 2), dual_clip=3.0, agg="seq-mean-token-sum"
    )
    loss.backward()
    assert loss.item() == pytest.approx(-2.2 + 3.0)
    torch.testing.assert_close(lp.grad, torch.tensor([[-2.2, 0.0]]))
    assert metrics["policy/dualclip_frac"].item() == pytest.approx(0.5)


def test_policy_loss_accepts_sequence_advantages() -> None:
    batch = random_policy_batch(seed=1)
    per_seq = batch["adv"][:, 0]
    a, _ = losses.policy_loss(batch["lp"], batch["prox"], batch["beh"], per_seq, batch["mask"])
    expanded = per_seq[:, None].expand_as(batch["lp"])
    b, _ = losses.policy_loss(batch["lp"], batch["prox"], batch["beh"], expanded, batch["mask"])
    torch.testing.assert_close(a, b)


def test_bypass_is_on_policy_gradient() -> None:
    # proximal = behavior = the current logprobs (even undetached): r = 1, w = 1, grad = -A / N.
    lp = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([1.0, -2.0], dtype=torch.float64)
    loss, metrics = losses.policy_loss(lp, lp, lp, adv, torch.ones(2, 3), correction="token-tis")
    loss.backward()
    torch.testing.assert_close(lp.grad, -adv[:, None].expand(2, 3) / 6)
    assert metrics["policy/is_weight_mean"].item() == 1.0
    assert metrics["policy/approx_kl"].item() == 0.0


def test_corrections_hand_computed() -> None:
    # Sequence 0: per-token log rho = [+1, -1] (product 1, geometric mean 1).
    # Sequence 1: per-token log rho = [+1, +1] (product e^2, geometric mean e).
    beh = torch.zeros(2, 2)
    prox = torch.tensor([[1.0, -1.0], [1.0, 1.0]])
    mask = torch.ones(2, 2)
    e = math.e

    def weights(correction: str, **kw: float) -> list[float]:
        # One masked-in token at a time, A = -1 and r = 1: the loss is exactly that token's w.
        out = []
        for b, t in [(0, 0), (0, 1), (1, 0), (1, 1)]:
            one = torch.zeros(2, 2)
            one[b, t] = 1
            loss, _ = losses.policy_loss(
                prox, prox, beh, -torch.ones(2, 2), one, correction=correction, **kw
            )
            out.append(loss.item())
        return out

    assert weights("none") == [1, 1, 1, 1]
    assert weights("token-tis", is_cap=2.0) == pytest.approx([2, 1 / e, 2, 2])
    assert weights("token-tis", is_cap=3.0) == pytest.approx([e, 1 / e, e, e])
    assert weights("token-mask", is_cap=2.0) == [0, 0, 0, 0]  # 1/2 <= rho <= 2 fails
    assert weights("token-mask", is_cap=3.0) == [1, 1, 1, 1]  # is_low = 1/3 <= 1/e
    assert weights("token-mask", is_cap=3.0, is_low=0.4) == [1, 0, 1, 1]
    # The one-token masks above make "sequence" = that token, so test sequences on full masks.
    _, m = losses.policy_loss(prox, prox, beh, -torch.ones(2, 2), mask, correction="seq-tis")
    assert m["policy/is_weight_max"].item() == pytest.approx(2.0)  # min(e^2, 2)
    assert m["policy/is_weight_mean"].item() == pytest.approx((1 + 1 + 2 + 2) / 4)
    _, m = losses.policy_loss(prox, prox, beh, -torch.ones(2, 2), mask, correction="seq-mask")
    assert m["policy/is_masked_frac"].item() == pytest.approx(0.5)  # sequence 1: e > 2, dropped
    _, m = losses.policy_loss(
        prox, prox, beh, -torch.ones(2, 2), mask, correction="seq-mask", is_cap=3.0
    )
    assert m["policy/is_masked_frac"].item() == 0.0


def test_masked_tokens_do_not_move_sequence_corrections() -> None:
    prox = torch.tensor([[0.1, 40.0]])
    beh = torch.zeros(1, 2)
    mask = torch.tensor([[1, 0]])
    for correction in ("seq-tis", "seq-mask"):
        _, m = losses.policy_loss(prox, prox, beh, torch.ones(1, 2), mask, correction=correction)
        expected = math.exp(0.1) if correction == "seq-tis" else 1.0
        assert m["policy/is_weight_mean"].item() == pytest.approx(expected)


# ------------------------------------------------------------------ value loss


def test_value_loss_matches_reference() -> None:
    gen = torch.Generator().manual_seed(5)
    values = torch.randn(3, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    returns = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    old = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    mask = (torch.rand(3, 5, generator=gen) > 0.3).long()
    clip = 0.2
    per_token = []
    for v_row, r_row, o_row in zip(values.tolist(), returns.tolist(), old.tolist(), strict=True):
        per_token.append(
            [
                0.5 * max((v - r) ** 2, (clamp(v, o - clip, o + clip) - r) ** 2)
                for v, r, o in zip(v_row, r_row, o_row, strict=True)
            ]
        )
    for agg in AGGS:
        got = losses.value_loss(values, returns, old, mask, clip=clip, agg=agg)
        assert_scalar(got, ref_aggregate(per_token, mask.tolist(), agg, None))


def test_value_loss_hand_computed() -> None:
    # v = 2, R = 0, v_old = 1, clip 0.5: max(4, 1.5^2) / 2 = 2 (the unclipped term wins).
    # v = 0.4, R = 2, v_old = 1: clipped v = 0.5, max(2.56, 2.25) / 2 = 1.28.
    v = torch.tensor([[2.0, 0.4]], requires_grad=True)
    loss = losses.value_loss(
        v, torch.tensor([[0.0, 2.0]]), torch.ones(1, 2), torch.ones(1, 2), clip=0.5
    )
    loss.backward()
    assert loss.item() == pytest.approx((2.0 + 1.28) / 2)
    torch.testing.assert_close(v.grad, torch.tensor([[1.0, -0.8]]))


# ------------------------------------------------------------------ logit reductions


def ref_logprobs_and_entropy(logits: torch.Tensor, tokens: torch.Tensor) -> tuple[list, list]:
    """Plain-Python float64 log-softmax per row."""
    lps, ents = [], []
    for row_logits, row_tokens in zip(logits.tolist(), tokens.tolist(), strict=True):
        lp_row, ent_row = [], []
        for z, y in zip(row_logits, row_tokens, strict=True):
            top = max(z)
            lse = top + math.log(sum(math.exp(v - top) for v in z))
            lp_row.append(z[y] - lse)
            ent_row.append(-sum(math.exp(v - lse) * (v - lse) for v in z))
        lps.append(lp_row)
        ents.append(ent_row)
    return lps, ents


@pytest.mark.parametrize("chunk_size", [1, 3, 1000, None])
def test_token_logprobs_and_entropy_match_reference(chunk_size: int | None) -> None:
    gen = torch.Generator().manual_seed(chunk_size or 0)
    logits = torch.randn(3, 5, 11, generator=gen, dtype=torch.float64) * 4
    logits[0, 0, 3] = 60.0  # a peaked row
    tokens = torch.randint(11, (3, 5), generator=gen)
    ref_lp, ref_ent = ref_logprobs_and_entropy(logits, tokens)
    got_lp = losses.token_logprobs(logits, tokens, chunk_size=chunk_size)
    got_ent = losses.token_entropy(logits, chunk_size=chunk_size)
    torch.testing.assert_close(got_lp, torch.tensor(ref_lp, dtype=torch.float64))
    torch.testing.assert_close(got_ent, torch.tensor(ref_ent, dtype=torch.float64))
    mask = torch.rand(3, 5, generator=gen) > 0.3
    kept = [
        e
        for row, m in zip(ref_ent, mask.tolist(), strict=True)
        for e, k in zip(row, m, strict=True)
        if k
    ]
    expected = sum(kept) / len(kept)
    assert_scalar(losses.entropy(logits, mask, chunk_size=chunk_size), expected)


def test_logit_reductions_gradcheck() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    tokens = torch.randint(5, (2, 3), generator=gen)
    assert torch.autograd.gradcheck(
        lambda z: losses.token_logprobs(z, tokens, chunk_size=2, temperature=0.7), (logits,)
    )
    assert torch.autograd.gradcheck(
        lambda z: losses.token_entropy(z, chunk_size=4, temperature=1.3), (logits,)
    )


def test_gradients_match_autograd_reference_in_bfloat16() -> None:
    gen = torch.Generator().manual_seed(1)
    logits = (torch.randn(2, 4, 7, generator=gen) * 3).bfloat16().requires_grad_(True)
    tokens = torch.randint(7, (2, 4), generator=gen)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    weights = torch.randn(2, 4, generator=gen)
    loss = (losses.token_logprobs(logits, tokens, chunk_size=3) * weights).sum()
    loss = loss - losses.entropy(logits, mask, chunk_size=3)
    loss.backward()
    assert logits.grad.dtype == torch.bfloat16

    ref = logits.detach().double().requires_grad_(True)
    logp = torch.log_softmax(ref, dim=-1)
    ref_loss = (logp.gather(-1, tokens[..., None]).squeeze(-1) * weights.double()).sum()
    ent = -(logp.exp() * logp).sum(-1)
    ref_loss = ref_loss - (ent * mask).sum() / mask.sum()
    ref_loss.backward()
    torch.testing.assert_close(logits.grad.double(), ref.grad, atol=2e-2, rtol=2e-2)


def test_entropy_with_minus_inf_logits_and_empty_mask() -> None:
    logits = torch.tensor([[[0.0, -float("inf"), 0.0], [1e4, -1e4, 0.0]]], requires_grad=True)
    out = losses.token_entropy(logits)
    torch.testing.assert_close(out.detach(), torch.tensor([[math.log(2), 0.0]]))
    out.sum().backward()
    assert torch.isfinite(logits.grad).all()
    empty = losses.entropy(logits, torch.zeros(1, 2))
    assert empty.item() == 0.0


def test_logit_reductions_save_no_vocab_sized_activation() -> None:
    """Autograd keeps the logits themselves and O(B*T) floats, not a [B,T,V] float32 copy."""
    b, t, v = 2, 8, 50
    logits = torch.randn(b, t, v).bfloat16().requires_grad_(True)
    tokens = torch.randint(v, (b, t))
    saved: list[torch.Tensor] = []

    def pack(x: torch.Tensor) -> torch.Tensor:
        saved.append(x)
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        losses.token_logprobs(logits, tokens, chunk_size=4)
        losses.token_entropy(logits, chunk_size=4)
    vocab_sized = [x for x in saved if x.numel() >= b * t * v]
    assert all(x.data_ptr() == logits.data_ptr() for x in vocab_sized)
    assert sum(x.numel() for x in saved if x.numel() < b * t * v) <= 5 * b * t


def test_chunk_size_must_be_positive() -> None:
    with pytest.raises(ValueError):
        losses.token_logprobs(torch.zeros(1, 1, 2), torch.zeros(1, 1).long(), chunk_size=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_losses_do_not_sync_on_cuda() -> None:
    batch = {k: v.float().cuda() for k, v in random_policy_batch(seed=0).items()}
    logits = torch.randn(5, 8, 32, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    tokens = torch.randint(32, (5, 8), device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        lp = losses.token_logprobs(logits, tokens, chunk_size=16)
        total = -losses.entropy(logits, batch["mask"], chunk_size=16)
        for correction in CORRECTIONS:
            for agg in AGGS:
                loss, _ = losses.policy_loss(
                    lp,
                    batch["prox"],
                    batch["beh"],
                    batch["adv"],
                    batch["mask"],
                    correction=correction,
                    agg=agg,
                    dual_clip=3.0,
                )
                total = total + loss
        total = total + losses.value_loss(
            batch["lp"], batch["prox"], batch["beh"], batch["mask"], clip=0.2
        )
        total.backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("chunk_size", [1, 4, None])
@pytest.mark.parametrize("use", ["both", "logprobs", "entropy"])
def test_logprobs_and_entropy_from_one_softmax_equal_the_two_calls(chunk_size, use) -> None:
    """``token_logprobs_and_entropy``: the values of ``token_logprobs`` and ``token_entropy``,
    and the gradient of a loss on either output or both, to float64 rounding; a banned
    (-inf) logit stays finite in both; k tokens per position as ``tokens_logprobs``."""
    gen = torch.Generator().manual_seed(3)
    base = torch.randn(3, 4, 9, generator=gen, dtype=torch.float64) * 3
    base[1, 2, 5] = float("-inf")
    tokens = torch.randint(9, (3, 4), generator=gen)
    tokens[1, 2] = 0
    w_lp, w_ent = torch.randn(3, 4, generator=gen, dtype=torch.float64), torch.randn(3, 4)
    grads = []
    for fused in (True, False):
        logits = base.clone().requires_grad_(True)
        if fused:
            lp, ent = losses.token_logprobs_and_entropy(
                logits, tokens, chunk_size=chunk_size, temperature=0.7
            )
        else:
            lp = losses.token_logprobs(logits, tokens, chunk_size=chunk_size, temperature=0.7)
            ent = losses.token_entropy(logits, chunk_size=chunk_size, temperature=0.7)
        assert torch.isfinite(lp).all() and torch.isfinite(ent).all()
        loss = {"both": (lp * w_lp).sum() + (ent * w_ent).sum(), "logprobs": (lp * w_lp).sum()}
        loss["entropy"] = (ent * w_ent).sum()
        loss[use].backward()
        grads.append((lp.detach(), ent.detach(), logits.grad))
    for fused, apart in zip(*grads, strict=True):
        torch.testing.assert_close(fused, apart)
    top = torch.randint(9, (3, 4, 3), generator=gen)
    lp_k, _ = losses.token_logprobs_and_entropy(base, top, temperature=1.3)
    torch.testing.assert_close(lp_k, losses.tokens_logprobs(base, top, temperature=1.3))
    z = torch.randn(2, 3, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    pick = torch.randint(5, (2, 3), generator=gen)
    assert torch.autograd.gradcheck(
        lambda x: losses.token_logprobs_and_entropy(x, pick, chunk_size=2, temperature=0.7), (z,)
    )
