"""The role specs the controller builds (``SpecFactory``) from the run's wiring.

The spec types live below both the controller and the roles (``streamrl.role_specs``), so a
role takes its spec whole without importing the controller (docs/design.md §2).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from streamrl.callables import blobs_for
from streamrl.config import Config
from streamrl.cores import role_threads
from streamrl.models.lora import initial_adapter_dir, uses_lora
from streamrl.role_specs import NODE, GeneratorSpec, LearnerSpec, RewardRoleSpec, ShardSpec

# Subscriber ids of lagged teachers sit above any generator's and evaluation process's (anchor
# requests name their subscriber in the learners' logs).
TEACHER_SUBSCRIBER_BASE = 2_000_000


def bind_host_for(address: str | None) -> str:
    """Local mode binds loopback; joining a cluster binds each node's own address."""
    return "127.0.0.1" if address is None else NODE


@dataclass
class SpecFactory:
    """Builds every role's spec from the run's wiring (filled in as the run starts: the
    endpoints roles bound). A restarted role gets its predecessor's ports."""

    config: Config
    run_dir: Path
    model_dir: str
    bind_host: str
    report_endpoint: str = ""
    admission_endpoint: str = ""
    cores: dict[str, list[list[int]]] = field(default_factory=dict)  # per role instance
    available_cores: list[int] = field(default_factory=list)
    shard_endpoints: list[tuple[str, str]] = field(default_factory=list)  # (ingest, requests)
    weight_endpoints: list[tuple[str, str]] = field(default_factory=list)  # (PUB, anchors)
    # Each reward role's ROUTER, by its reward's index in ``rewards:`` (docs/design.md §7c).
    reward_endpoints: dict[int, str] = field(default_factory=dict)
    # The callables the config names by ``python:`` (``streamrl.train``'s, pickled when it
    # registered them): read once from this process's table, sent to every generator.
    callables: dict[str, bytes] = field(init=False, default_factory=dict)
    # LoRA: version 0 of the adapters, which every learner rank and generator loads.
    adapter_dir: str = field(init=False, default="")

    def __post_init__(self) -> None:
        self.callables = blobs_for(self.config)
        if uses_lora(self.config):
            self.adapter_dir = str(initial_adapter_dir(self.run_dir).resolve())

    def shard(self, shard_id: int, ports: tuple[int, int] = (0, 0)) -> ShardSpec:
        return ShardSpec(
            log_file=self.log_file(f"buffer-{shard_id}"),
            bind_host=self.bind_host,
            config=self.config.buffer,
            shard_id=shard_id,
            log_dir=str((self.run_dir / "buffer").resolve()),
            report_endpoint=self.report_endpoint,
            ingest_port=ports[0],
            request_port=ports[1],
            vocab_size=vocab_size(Path(self.model_dir)),
        )

    def learner(
        self,
        rank: int,
        ports: tuple[int, int] = (0, 0),
        incarnation: int = 0,
        forks: list[int] | None = None,
    ) -> LearnerSpec:
        config = self.role_config("learner", rank)
        if any(ports):  # a restarted group: it goes on from the newest checkpoint
            config = msgspec.structs.replace(
                config, run=msgspec.structs.replace(config.run, resume=True)
            )
        return LearnerSpec(
            log_file=self.log_file(f"learner-{rank}"),
            bind_host=self.bind_host,
            cores=self.cores_of("learner", rank),
            config=config,
            rank=rank,
            world_size=self.config.learner.count,
            model_dir=self.model_dir,
            shard_endpoints=[req for _, req in self.shard_endpoints],
            report_endpoint=self.report_endpoint,
            checkpoint_dir=str((self.run_dir / "checkpoints").resolve()),
            adapter_dir=self.adapter_dir,
            pub_port=ports[0],
            anchor_port=ports[1],
            incarnation=incarnation,
            encoder_cores=self.available_cores if self.cores else None,
            forks=list(forks or []),
            record_run_dir=str(self.run_dir.resolve()) if config.run.training_record else "",
        )

    def generator(self, generator_id: int, incarnation: int) -> GeneratorSpec:
        return GeneratorSpec(
            log_file=self.log_file(f"generator-{generator_id}"),
            bind_host=self.bind_host,
            cores=self.cores_of("generator", generator_id),
            config=self.role_config("generator", generator_id),
            generator_id=generator_id,
            model_dir=self.model_dir,
            shard_endpoints=[ingest for ingest, _ in self.shard_endpoints],
            publisher_endpoints=[p for p, _ in self.weight_endpoints],
            anchor_endpoints=[a for _, a in self.weight_endpoints],
            admission_endpoint=self.admission_endpoint,
            report_endpoint=self.report_endpoint,
            adapter_dir=self.adapter_dir,
            incarnation=incarnation,
            callables=self.callables,
            reward_endpoints=dict(self.reward_endpoints),
            slack_cores=self.available_cores if self.cores else None,
        )

    def reward_role(
        self, index: int, model_dir: str, port: int = 0, incarnation: int = 0
    ) -> RewardRoleSpec:
        cores = self.cores_of("scoring", index)
        threads = role_threads(self.config, "scoring", cores, len(self.available_cores))
        scoring = msgspec.structs.replace(self.config.scoring, threads=threads)
        return RewardRoleSpec(
            log_file=self.log_file(f"reward-{index}"),
            bind_host=self.bind_host,
            cores=cores,
            config=msgspec.structs.replace(self.config, scoring=scoring),
            index=index,
            model_dir=model_dir,
            report_endpoint=self.report_endpoint,
            port=port,
            incarnation=incarnation,
            student=self.student_feed(index) if self.config.rewards[index].lagged_teacher else None,
        )

    def student_feed(self, index: int) -> GeneratorSpec:
        """A lagged teacher's subscription to the learners' weights (``RewardRoleSpec.student``):
        a generator's spec under an id of its own, built once the learners publish."""
        assert self.weight_endpoints, "a lagged teacher starts after the learners"
        return self.generator(TEACHER_SUBSCRIBER_BASE + index, 0)

    def cores_of(self, role: str, index: int) -> list[int] | None:
        sets = self.cores.get(role)
        return sets[index % len(sets)] if sets else None  # generators added live share

    def threads(self, role: str, index: int) -> int:
        cores = self.cores_of(role, index)
        return role_threads(self.config, role, cores, len(self.available_cores))

    def role_config(self, role: str, index: int) -> Config:
        """The run's config as one role instance sees it: its torch threads resolved."""
        section = getattr(self.config, role)
        threads = self.threads(role, index)
        return msgspec.structs.replace(
            self.config, **{role: msgspec.structs.replace(section, threads=threads)}
        )

    def log_file(self, role: str) -> str:
        return str((self.run_dir / "logs" / f"{role}.log").resolve())


def vocab_size(model_dir: Path) -> int:
    """The model's vocabulary (its embedding rows), from its config.json; 0 if unknown."""
    try:
        return int(json.loads((model_dir / "config.json").read_text()).get("vocab_size", 0))
    except (OSError, ValueError, TypeError, AttributeError):
        return 0
