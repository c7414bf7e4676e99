"""The output head sees contiguous hidden states, whatever slice ``logits_to_keep`` takes."""

from __future__ import annotations

import torch

from streamrl.models import TINY, load_causal_lm, resolve_model


def test_logits_to_keep_hands_the_head_a_contiguous_input() -> None:
    model = load_causal_lm(resolve_model(TINY), dtype="float32").eval()
    seen: list[bool] = []
    model.get_output_embeddings().register_forward_pre_hook(
        lambda _m, args: seen.append(args[0].is_contiguous())
    )
    ids = torch.randint(0, model.config.vocab_size, (3, 9))
    with torch.no_grad():
        kept = model(input_ids=ids, logits_to_keep=4).logits
        full = model(input_ids=ids).logits
    # A no-grad matmul on a strided [B, keep, H] slice would copy the head's weight per row.
    assert seen == [True, True]
    torch.testing.assert_close(kept, full[:, -4:])
