"""Role specs carry their bind host: loopback locally, the node's own address on a cluster."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest
import zmq

from streamrl.config import BufferConfig, load_config
from streamrl.controller.specs import SpecFactory, bind_host_for
from streamrl.role_specs import NODE, GeneratorSpec, LearnerSpec, ShardSpec
from streamrl.transport import resolve_host

NODE_IP = "127.0.0.2"  # stands in for another machine's address: not the loopback default


def _specs(address: str | None, tmp_path: Path) -> list:
    factory = SpecFactory(
        load_config(None, []),
        tmp_path,
        str(tmp_path / "model"),
        bind_host_for(address),
        report_endpoint="tcp://10.0.0.1:5000",
        admission_endpoint="tcp://10.0.0.1:5001",
        shard_endpoints=[("tcp://10.0.0.2:1", "tcp://10.0.0.2:2")],
        weight_endpoints=[("tcp://10.0.0.3:1", "tcp://10.0.0.3:2")],
    )
    return [factory.shard(0), factory.learner(0), factory.generator(0, 0)]


def test_local_specs_bind_loopback(tmp_path: Path) -> None:
    assert {spec.bind_host for spec in _specs(None, tmp_path)} == {"127.0.0.1"}


def test_cluster_specs_bind_the_nodes_address(tmp_path: Path, monkeypatch) -> None:
    specs = _specs("10.0.0.1:6379", tmp_path)
    assert [type(s) for s in specs] == [ShardSpec, LearnerSpec, GeneratorSpec]
    assert {spec.bind_host for spec in specs} == {NODE}
    # Specs travel through Ray as msgspec structs: torch-free, round-trip exact.
    for spec in specs:
        assert msgspec.msgpack.decode(msgspec.msgpack.encode(spec), type=type(spec)) == spec
    import ray.util

    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: NODE_IP)
    assert resolve_host(NODE) == NODE_IP
    # What the roles bind from those specs: the node's address, never loopback.
    from streamrl.buffers.server import BufferShard

    shard_spec = specs[0]
    shard = BufferShard(BufferConfig(durable=False), 0, host=resolve_host(shard_spec.bind_host))
    try:
        assert shard.ingest_endpoint.startswith(f"tcp://{NODE_IP}:")
        assert shard.request_endpoint.startswith(f"tcp://{NODE_IP}:")
    finally:
        shard.close()


def test_publisher_binds_the_host_it_is_given() -> None:
    torch = pytest.importorskip("torch")
    from streamrl.config import WeightsConfig
    from streamrl.workers.learning.publisher import WeightPublisher

    ctx = zmq.Context()
    publisher = WeightPublisher(torch.nn.Linear(4, 4), 0, 1, WeightsConfig(), ctx, NODE_IP)
    try:
        assert publisher.pub_endpoint.startswith(f"tcp://{NODE_IP}:")
        assert publisher.anchor_endpoint.startswith(f"tcp://{NODE_IP}:")
    finally:
        publisher.close()
        ctx.destroy(linger=0)


def test_a_pinned_learner_lends_its_encoder_the_runs_cores(tmp_path: Path) -> None:
    from streamrl.controller.placement import cpu_split

    for pinned in (False, True):
        config = load_config(None, [f"placement.pin_cpus={str(pinned).lower()}"])
        available = [0, 1, 2, 3]
        factory = SpecFactory(
            config,
            tmp_path,
            str(tmp_path / "model"),
            "127.0.0.1",
            report_endpoint="tcp://127.0.0.1:3",
            # As the controller's start does in local mode.
            cores=cpu_split(config, available) if pinned else {},
            available_cores=available,
            shard_endpoints=[("tcp://127.0.0.1:1", "tcp://127.0.0.1:2")],
        )
        spec = factory.learner(0)
        if pinned:
            assert spec.cores == [0, 1] and spec.encoder_cores == [0, 1, 2, 3]
        else:
            assert spec.cores is None and spec.encoder_cores is None


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_the_publishers_encoder_thread_runs_on_the_cores_it_is_given() -> None:
    """Affinity is per thread: the encoder widens its own, the learner's thread keeps one core."""
    torch = pytest.importorskip("torch")
    from streamrl.config import WeightsConfig
    from streamrl.workers.learning.publisher import WeightPublisher

    everything = sorted(os.sched_getaffinity(0))
    ctx = zmq.Context()
    os.sched_setaffinity(0, everything[:1])  # this thread only, as a pinned rank's main thread
    try:
        publisher = WeightPublisher(
            torch.nn.Linear(4, 4), 0, 1, WeightsConfig(), ctx, encoder_cores=everything
        )
        try:
            publisher.publish(1)
            assert publisher.flush(timeout_s=30)
            encoder = publisher._threads[0]
            assert os.sched_getaffinity(encoder.native_id) == set(everything)
            assert os.sched_getaffinity(0) == set(everything[:1])
        finally:
            publisher.close()
    finally:
        os.sched_setaffinity(0, everything)
        ctx.destroy(linger=0)
