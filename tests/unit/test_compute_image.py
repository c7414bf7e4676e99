"""One learner rank trains on a ``ComputeImage`` instead of FSDP2 (``workers/learning/fsdp.py``):
the same forward, the same gradients on the fp32 masters, and the masters untouched until the
optimizer steps. FSDP2 on the same one-rank mesh is the reference."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from support import whole

from streamrl.models import TINY, load_causal_lm, resolve_model
from streamrl.workers.learning.fsdp import (
    ComputeImage,
    fully_shard_model,
    release_compute_image,
    set_gradient_sync,
    shard_for_training,
)
from streamrl.workers.learning.learner import rendezvous

pytestmark = pytest.mark.slow  # a process group and a model per test


@pytest.fixture
def mesh():
    store = rendezvous("127.0.0.1:0", 0, 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield dist.device_mesh.init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def _off_grid_model() -> torch.nn.Module:
    """The tiny model in fp32 with masters off the bf16 grid (as after a few updates)."""
    model = load_causal_lm(resolve_model(TINY), "float32")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 1e-3)
    return model


def _two_micro_batches(model: torch.nn.Module) -> torch.Tensor:
    """Logits of the first of two micro-batches whose gradients accumulate into one update."""
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randint(4, 100, (3, 12), generator=gen) for _ in range(2)]
    first = None
    for i, ids in enumerate(batches):
        set_gradient_sync([model], i == len(batches) - 1)
        logits = model(input_ids=ids).logits
        first = logits.detach() if first is None else first
        logits.float().log_softmax(-1)[..., 5].sum().backward()
    return first


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_one_rank_matches_fsdp2(mesh, dtype: str) -> None:
    image_model = shard_for_training(_off_grid_model(), mesh, dtype)
    assert isinstance(image_model.compute_image, ComputeImage)
    fsdp_model = fully_shard_model(_off_grid_model(), mesh, getattr(torch, dtype), True)
    masters = {n: p.detach().clone() for n, p in image_model.named_parameters()}
    torch.testing.assert_close(_two_micro_batches(image_model), _two_micro_batches(fsdp_model))
    grads = dict(image_model.named_parameters())
    for name, reference in fsdp_model.named_parameters():
        got = grads[name]
        # After the update's last backward the parameters are the masters again, fp32
        # gradients on them.
        assert got.dtype == torch.float32 and torch.equal(got.detach(), masters[name]), name
        assert got.grad.dtype == torch.float32, name
        torch.testing.assert_close(got.grad, whole(reference.grad), rtol=1e-5, atol=1e-6)


def test_fp32_forward_sees_the_bf16_grid_and_the_optimizer_the_masters(mesh) -> None:
    model = shard_for_training(_off_grid_model(), mesh, "float32")
    masters = {n: p.detach().clone() for n, p in model.named_parameters()}
    head = model.get_output_embeddings().weight.detach().clone()
    seen = {}
    hook = model.get_output_embeddings().register_forward_pre_hook(
        lambda module, _args: seen.update(weight=module.weight.detach().clone())
    )
    ids = torch.randint(4, 100, (2, 8))
    with torch.no_grad():
        model(input_ids=ids)
    hook.remove()
    assert torch.equal(seen["weight"], head.to(torch.bfloat16).float())
    assert not torch.equal(seen["weight"], head)
    # A forward no backward follows keeps the image until released (as FSDP2's reshard).
    release_compute_image(model)
    for name, p in model.named_parameters():
        assert torch.equal(p.detach(), masters[name]), name
    model(input_ids=ids).logits.sum().backward()
    torch.optim.SGD(model.parameters(), lr=1e-2).step()
    moved = [n for n, p in model.named_parameters() if not torch.equal(p.detach(), masters[n])]
    assert moved and all(
        not torch.equal(p.detach(), p.detach().to(torch.bfloat16).float())
        for n, p in model.named_parameters()
        if n in moved
    )


def test_the_publisher_s_snapshot_is_the_next_forward_s_image(mesh) -> None:
    """A one-rank bf16 learner's next forward takes the weight publisher's bf16 snapshot of
    its masters (``offer_compute_image``) instead of casting them again: the forward reads
    those very tensors, and logits and gradients are those of a fresh cast. An offer does not
    outlive a release (the masters may change after one), nor serve two refreshes."""
    from streamrl.config import WeightsConfig
    from streamrl.workers.learning.fsdp import offer_compute_image
    from streamrl.workers.learning.publisher import WeightPublisher
    from streamrl.workers.learning.shard_image import whole_tensors

    offered, fresh = (shard_for_training(_off_grid_model(), mesh, "bfloat16") for _ in range(2))
    publisher = WeightPublisher(offered, 0, 1, WeightsConfig())
    try:
        publisher.publish(1)
        snapshot = whole_tensors(publisher.last_snapshot)
        names = {n for n, _ in offered.named_parameters()}
        assert set(snapshot) == names
        assert offer_compute_image(offered, snapshot) == len(names)
        head = offered.get_output_embeddings()
        seen = {}
        hook = head.register_forward_pre_hook(lambda m, _a: seen.update(weight=m.weight.data))
        logits = _two_micro_batches(offered)
        hook.remove()
        tied_name = next(n for n, p in offered.named_parameters() if p is head.weight)
        assert seen["weight"].data_ptr() == snapshot[tied_name].data_ptr()
        torch.testing.assert_close(logits, _two_micro_batches(fresh), rtol=0, atol=0)
        grads = dict(fresh.named_parameters())
        for name, p in offered.named_parameters():
            assert torch.equal(p.grad, grads[name].grad), name
        assert offered.compute_image._offered == {}  # taken by the first refresh only
        assert offer_compute_image(offered, snapshot) == len(names)
        release_compute_image(offered)
        assert offered.compute_image._offered == {}
        # Not the refresh's own tensors (another dtype): left out.
        assert offer_compute_image(offered, {n: t.float() for n, t in snapshot.items()}) == 0
    finally:
        publisher.close()
