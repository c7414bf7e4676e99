"""Ray actor shells: one per role, each a thin process wrapper around the role's class.

They configure logging to the run's ``logs/`` folder, pin torch threads, and forward calls.
``max_concurrency=2`` lets the controller call ``stop``/``endpoints`` while ``run`` is busy.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import ray


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
    if cores:
        # Affinity only: the role sets its torch threads (placement.role_threads).
        os.sched_setaffinity(0, cores)
        logging.getLogger("streamrl").info("pinned to cores %s", cores)


@ray.remote(num_cpus=0, max_concurrency=2)
class BufferShardActor:
    def __init__(self, log_file: str, *args: Any, **kwargs: Any) -> None:
        _setup_process(log_file)
        from streamrl.buffers.server import BufferShard

        self.shard = BufferShard(*args, **kwargs)

    def endpoints(self) -> tuple[str, str]:
        return self.shard.ingest_endpoint, self.shard.request_endpoint

    def pid(self) -> int:
        return os.getpid()

    def serve(self) -> None:
        try:
            self.shard.serve()
        finally:
            self.shard.close()

    def stop(self) -> None:
        self.shard.stop()


@ray.remote(num_cpus=0, max_concurrency=2)
class LearnerActor:
    """Two-phase start: rank 0's address must be known before any rank joins the group."""

    def __init__(self, log_file: str, cores: list[int] | None = None) -> None:
        _setup_process(log_file, cores)
        self.learner = None

    def rendezvous_address(self) -> str:
        from streamrl.transport import bind_host, free_port

        host = bind_host()
        return f"{host}:{free_port(host)}"

    def setup(self, *args: Any) -> tuple[str, str]:
        from streamrl.workers.learner import Learner

        self.learner = Learner(*args)
        return self.learner.endpoints()

    def pid(self) -> int:
        return os.getpid()

    def run(self, max_steps: int) -> int:
        return self.learner.run(max_steps)

    def export_hf(self, out_dir: str) -> None:
        self.learner.export_hf(out_dir)

    def version(self) -> int:
        return self.learner.version

    def request_checkpoint(self) -> None:
        self.learner.request_checkpoint()

    def set_max_staleness(self, value: int) -> None:
        # Read once per step by run(): the next batch request uses the new bound.
        self.learner.config.buffer.max_staleness = value

    def final_checkpoint(self) -> str:
        return str(self.learner.final_checkpoint())

    def stop(self) -> None:
        if self.learner is not None:
            self.learner.request_stop()

    def close(self) -> None:
        self.learner.close()


@ray.remote(num_cpus=0, max_concurrency=2)
class GeneratorActor:
    def __init__(self, log_file: str, *args: Any, cores: list[int] | None = None) -> None:
        _setup_process(log_file, cores)
        from streamrl.workers.generator import Generator

        self.generator = Generator(*args)

    def pid(self) -> int:
        return os.getpid()

    def run(self) -> dict[str, int]:
        try:
            return self.generator.run()
        finally:
            self.generator.close()
