"""What each role is started with: typed, torch-free msgspec structs, one per role.

A spec is the whole of a role's wiring: the endpoints it connects to and the host it binds its
own sockets on. The controller builds them (``controller.specs.SpecFactory``); each role's
class takes its spec whole (``Generator(spec)``, ``Learner(spec, master)``,
``BufferShardActor(spec)``). They live here, below both, so the workers do not import the
controller (docs/design.md §2). Stdlib, msgspec and the config leaf only.

``bind_host`` is explicit: ``127.0.0.1`` in local mode; ``"node"`` on a cluster, which the
role resolves to its node's address (``transport.resolve_host``) because the controller cannot
know which node Ray will place it on. No environment variable is read.

Example (cluster mode)::

    ShardSpec(log_file=..., bind_host="node", config=cfg.buffer, shard_id=0, ...)
    # the shard binds tcp://10.0.0.7:<port>, reachable from generators on other nodes
"""

from __future__ import annotations

import msgspec

from streamrl.config import BufferConfig, Config

NODE = "node"  # bind_host value: this node's address, resolved in the role's process
# Incarnations of a reward role that may die scoring one request before it is refused
# (``RewardRoleSpec.suspects``).
QUARANTINE_AFTER = 2


class RoleSpec(msgspec.Struct, kw_only=True):
    log_file: str
    bind_host: str
    cores: list[int] | None = None  # CPU affinity when placement.pin_cpus (local mode)


class ShardSpec(RoleSpec):
    config: BufferConfig
    shard_id: int
    log_dir: str
    report_endpoint: str
    # 0: any free port. A restarted shard binds its predecessor's ports, so every peer's
    # socket reconnects to it by itself (libzmq retries the same endpoint).
    ingest_port: int = 0
    request_port: int = 0
    vocab_size: int = 0  # the model's: groups with token ids outside it are refused


class LearnerSpec(RoleSpec):
    config: Config  # threads resolved for this rank
    rank: int
    world_size: int
    model_dir: str
    shard_endpoints: list[str]  # request (ROUTER) endpoints
    report_endpoint: str
    checkpoint_dir: str
    # LoRA: version 0 of the adapters (``streamrl.models.lora``); "" for full weights.
    adapter_dir: str = ""
    # 0: any free port. A restarted learner group binds its predecessor's weight ports.
    pub_port: int = 0
    anchor_port: int = 0
    incarnation: int = 0  # the group's restarts so far; its reports carry it
    forks: list[int] = []  # the version each restart resumed at (``streamrl.clock``)
    # Cores the weight publisher's encoder thread may run on: every core of the run when the
    # rank is pinned, so that encoding a version overlaps the next step on idle cores instead
    # of taking turns with it on the rank's own. None: the rank's cores.
    encoder_cores: list[int] | None = None
    # The run directory the training record goes under (``training_record``); "": none kept.
    record_run_dir: str = ""


class GeneratorSpec(RoleSpec):
    """A generator's own sockets connect; ``bind_host`` is where its engine listens (vLLM's
    process groups, world size 1)."""

    config: Config  # threads resolved for this generator
    generator_id: int
    model_dir: str
    shard_endpoints: list[str]  # ingest (PULL) endpoints
    publisher_endpoints: list[str]
    anchor_endpoints: list[str]
    admission_endpoint: str
    report_endpoint: str
    # LoRA: version 0 of the adapters (``streamrl.models.lora``); "" for full weights.
    adapter_dir: str = ""
    incarnation: int = 0  # restarts of this generator id so far; reports carry it
    # The Python API's callables the config names (``python:<name>`` -> cloudpickle bytes,
    # ``streamrl.callables``): registered first thing, before rewards or environments load.
    callables: dict[str, bytes] = {}
    # Each reward role's ROUTER by its reward's index in ``rewards:`` (served rewards only).
    reward_endpoints: dict[int, str] = {}
    # The run's cores, for work beside the engine that may go where there is slack (the
    # weight thread, the evaluation process); None: the process's own.
    slack_cores: list[int] | None = None


class RewardRoleSpec(RoleSpec):
    """A reward role (``workers.reward_roles.reward_role``): serves one ``rewards:`` entry's reward
    model or judge on its ROUTER."""

    config: Config  # scoring.threads resolved for this role
    index: int  # the reward's position in ``rewards:``
    model_dir: str  # the scorer's model, resolved by the controller
    report_endpoint: str
    # 0: any free port. A restarted role binds its predecessor's port, so every generator's
    # DEALER reconnects to it by itself.
    port: int = 0
    incarnation: int = 0
    # Request id -> how many of this role's incarnations died while scoring it
    # (``RewardRoleReport.scoring_ids``): scored alone after one, refused after two.
    suspects: dict[str, int] = {}
    # A lagged teacher's (``teacher.model: self``, docs/design.md §7d) subscription to the
    # student's weights, as a generator's: only its weight stream fields are read (the
    # learners' endpoints, the student's model and LoRA adapter, the subscriber id).
    student: GeneratorSpec | None = None
