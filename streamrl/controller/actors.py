"""Ray actor shells: one per role, each a thin process wrapper around the role's class.

Each takes one spec (``controller.specs``), configures logging to the run's ``logs/`` folder,
sets its CPU affinity, builds its role with the spec's fields and forwards calls.
``max_concurrency=2`` lets the controller call ``stop``/``endpoints`` while ``run`` is busy.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import ray

from streamrl.controller.specs import GeneratorSpec, LearnerSpec, RewardRoleSpec, ShardSpec
from streamrl.cores import favour_side_threads
from streamrl.malloc import (
    SlowCollections,
    defer_collections,
    freeze_startup_heap,
    keep_freed_memory,
)
from streamrl.transport import resolve_host


def _setup_process(log_file: str, cores: list[int] | None = None) -> None:
    Path(log_file).parent.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        filename=log_file,
        level=logging.INFO,
        force=True,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # Every role shares 2 cores here: one intra-op thread each unless the config says more.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    keep_freed_memory()
    SlowCollections().install()
    defer_collections()  # until the role's loop starts (freeze_startup_heap)
    if cores:
        # Affinity only: the role sets its torch threads (cores.role_threads).
        os.sched_setaffinity(0, cores)
        logging.getLogger("streamrl").info("pinned to cores %s", cores)


@ray.remote(num_cpus=0, max_concurrency=2)
class BufferShardActor:
    def __init__(self, spec: ShardSpec) -> None:
        _setup_process(spec.log_file, spec.cores)
        from streamrl.buffers.server import BufferShard

        self.shard = BufferShard.from_spec(spec)

    def endpoints(self) -> tuple[str, str]:
        return self.shard.ingest_endpoint, self.shard.request_endpoint

    def pid(self) -> int:
        return os.getpid()

    def serve(self) -> None:
        freeze_startup_heap()
        try:
            self.shard.serve()
        finally:
            self.shard.close()

    def stop(self) -> None:
        self.shard.stop()


@ray.remote(num_cpus=0, max_concurrency=2)
class LearnerActor:
    """Two-phase start: rank 0's address must be known before any rank joins the group."""

    def __init__(self, spec: LearnerSpec) -> None:
        _setup_process(spec.log_file, spec.cores)
        self.spec = spec
        self.learner = None
        self.listener = None  # rank 0's store socket, bound in rendezvous_address

    def rendezvous_address(self) -> str:
        from streamrl.workers.learning.learner import group_listener

        host = resolve_host(self.spec.bind_host)
        self.listener = group_listener(host, self.spec.world_size)
        return f"{host}:{self.listener.getsockname()[1]}"

    def setup(self, master: str) -> tuple[str, str]:
        from streamrl.workers.learning.learner import Learner

        self.learner = Learner(self.spec, master, self.listener)
        self.listener = None  # the store owns its descriptor now
        return self.learner.endpoints()

    def pid(self) -> int:
        return os.getpid()

    def run(self, max_steps: int) -> int:
        favour_side_threads()  # the weight path first on a shared core (streamrl.cores)
        freeze_startup_heap()  # no full collection over the model's objects (streamrl.malloc)
        return self.learner.run(max_steps)

    def export_hf(self, out_dir: str) -> None:
        self.learner.export_hf(out_dir)

    def version(self) -> int:
        return self.learner.version

    def request_checkpoint(self) -> None:
        self.learner.request_checkpoint()

    def set_live(self, key: str, value: Any) -> None:
        """A live knob that reaches learners (``controller.knobs``); run() reads the config
        once per step, so the next batch request uses it."""
        from streamrl.controller.knobs import set_key

        set_key(self.learner.config, key, value)

    def final_checkpoint(self) -> str:
        return str(self.learner.final_checkpoint())

    def stop(self) -> None:
        if self.learner is not None:
            self.learner.request_stop()

    def close(self) -> None:
        self.learner.close()


@ray.remote(num_cpus=0, max_concurrency=2)
class GeneratorActor:
    def __init__(self, spec: GeneratorSpec) -> None:
        _setup_process(spec.log_file, spec.cores)
        from streamrl.workers.generation.generator import Generator

        self.generator = Generator(spec)

    def pid(self) -> int:
        return os.getpid()

    def run(self) -> dict[str, int]:
        favour_side_threads()
        freeze_startup_heap()
        try:
            return self.generator.run()
        finally:
            self.generator.close()


@ray.remote(num_cpus=0, max_concurrency=2)
class RewardRoleActor:
    """A reward role (``workers.reward_roles.reward_role``); ``endpoint`` answers once its
    scorer loaded."""

    def __init__(self, spec: RewardRoleSpec) -> None:
        _setup_process(spec.log_file, spec.cores)
        from streamrl.workers.reward_roles.reward_role import RewardRole

        self.role = RewardRole(spec)

    def endpoint(self) -> str:
        return self.role.endpoint

    def pid(self) -> int:
        return os.getpid()

    def serve(self) -> None:
        favour_side_threads()
        freeze_startup_heap()
        try:
            self.role.serve()
        finally:
            self.role.close()

    def stop(self) -> None:
        self.role.stop()
