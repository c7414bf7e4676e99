"""The controller: ``streamrl launch`` places every role with Ray and drives the run.

```
  prompts ──► Generator actors (HF transformers on CPU/GPU, SGLang on GPU)
                 │  TrajectoryGroup  (msgspec, ZeroMQ PUSH → PULL)
                 ▼
             Buffer shards  (S processes; bounded; staleness-aware; durable)
                 │  BatchRequest / Batch  (ZeroMQ DEALER ↔ ROUTER)
                 ▼
             Learner group  (FSDP2, K ranks; gloo on CPU, NCCL on GPU)
                 │  WeightDiff  (lossless sparse bf16 diffs; ZeroMQ PUB → SUB)
                 ▼
             Generator actors apply the diff between decode steps (in flight)
```

| loop        | waits for                                   | unblocked by                      |
|-------------|---------------------------------------------|-----------------------------------|
| generator   | admission (staleness budget), fresh weights | learner versions, the subscriber  |
| buffer      | nothing (admits, evicts, answers)           | -                                 |
| learner     | a full batch within the staleness bound     | generators                        |
| publisher   | nothing (PUB drops; anchors repair)         | -                                 |
| controller  | reports from every role                     | learner steps, generator reports  |

The controller itself serves admission (a ROUTER thread: the one global count of groups
started), collects reports (PULL), writes ``metrics.jsonl``, and at the end exports the model
and ends every process it started.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import msgspec
import zmq

from streamrl.config import Config
from streamrl.controller.admission import AdmissionServer
from streamrl.controller.drops import DropWatch
from streamrl.controller.placement import (
    Placement,
    check_port_free,
    cpu_split,
    describe_split,
    init_ray,
    role_threads,
)
from streamrl.controller.records import outcome, run_summary, step_record
from streamrl.controller.rundir import (
    RunError,
    last_line,
    latest_checkpoint,
    prepare_run_dir,
    write_whole,
)
from streamrl.controller.specs import GeneratorSpec, LearnerSpec, ShardSpec, bind_host_for
from streamrl.controller.staleness import AdmissionPolicy
from streamrl.controller.state import RunState, load_prompt_ledger
from streamrl.controller.supervisor import GeneratorPool
from streamrl.metrics import MetricsLog
from streamrl.protocol import (
    BatchTaken,
    EvalReport,
    GeneratorReport,
    Heartbeat,
    LearnerStep,
    Report,
    ShardReport,
    TakeReceipt,
)
from streamrl.transport import Codec, bind_random, make_socket, resolve_host

log = logging.getLogger("streamrl")
# Reports are a few KiB; a shard's grows by ~30 bytes per generator process it heard from.
MAX_REPORT_BYTES = 1 << 22


# --------------------------------------------------------------------------- the run


class Controller:
    def __init__(self, config: Config, address: str | None = None, console=sys.stdout) -> None:
        self.config, self.address, self.console = config, address, console
        self.state = RunState()
        self.bind_host = bind_host_for(address)
        self.ctx = zmq.Context()
        self.report_codec: Codec[Report] = Codec(Report, "reports")
        self.policy = AdmissionPolicy(
            config.learner.groups_per_step, config.buffer.max_staleness, self.state
        )
        self.report_sock = self.admission = None
        self.actors: list[Any] = []
        self.pids: list[int] = []
        self._steps: list[LearnerStep] = []
        self.learners: list[Any] = []
        self.pool = GeneratorPool(self)
        self._all_pids: set[int] = set()  # every role process ever started (pids.json)
        self._pids_text = ""
        self.roles: dict[Any, str] = {}  # run() refs of learner ranks and buffer shards
        self.stopping = False
        self.last_record: dict[str, Any] = {}
        self._step_times: list[float] = []
        self._watched: list[Any] = []
        self.learner_refs: list[Any] = []
        self._rolled_back = 0  # groups given back by learner restarts (trained, then lost)
        self.drop_watch = DropWatch()
        self.ignored_reports: dict[str, int] = {}  # learner reports not taken, by why
        self.admin = self.live = None
        self.placement = Placement(config, address)
        self._token_samples: collections.deque = collections.deque(maxlen=4096)
        self._last_step_tokens: tuple[float, int] | None = None  # (time, generated tokens)
        self.evals: list[EvalReport] = []
        self.started_at = time.time()
        self.available_cores = sorted(os.sched_getaffinity(0))
        self.cores: dict[str, list[list[int]]] = {}  # per role instance, when pinned

    def run(self) -> dict[str, Any]:
        from streamrl.data import check_data
        from streamrl.models import resolve_model
        from streamrl.rewards import check_rewards

        cfg = self.config
        try:
            # Everything that can fail on bad input fails here, before any process starts.
            check_data(cfg.data)
            check_rewards(cfg.rewards)
            model_dir = str(
                resolve_model(
                    cfg.model.name,
                    tiny_hidden=cfg.model.tiny_hidden,
                    tiny_layers=cfg.model.tiny_layers,
                )
            )
            _check_engine(cfg, Path(model_dir))
            check_port_free(cfg.admin.host, cfg.admin.port, "admin endpoint")
            if self.address is None:  # pinning is a local-mode affair: cores are per node
                self.cores = cpu_split(cfg, self.available_cores)
            self.run_dir = prepare_run_dir(cfg)
            self.metrics = MetricsLog(self.run_dir / "metrics.jsonl", self.console, cfg)
            init_ray(self.address)
            import ray

            self._open_control_plane()
            if threading.current_thread() is threading.main_thread():
                # After ray.init, which installs a SIGTERM handler of its own that exits at once.
                signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
            try:
                return self._run(model_dir)
            except ray.exceptions.RayError as exc:  # a role failed to start
                raise RunError(f"{last_line(exc)} (see {self.run_dir / 'logs'})") from None
        finally:
            self.shutdown()

    def _open_control_plane(self) -> None:
        """Report and admission sockets; on a cluster they bind this node's address so roles
        on other nodes reach them (after ray.init, which knows that address)."""
        host = resolve_host(self.bind_host)
        # libzmq drops a peer that sends a bigger frame than MAX_REPORT_BYTES.
        self.report_sock = make_socket(self.ctx, zmq.PULL, rcvhwm=0, maxmsgsize=MAX_REPORT_BYTES)
        self.report_endpoint = bind_random(self.report_sock, host, "controller reports")
        self.admission = AdmissionServer(self.ctx, self.policy, self.state, host)

    def _start_admin(self, shard_request_endpoints: list[str]) -> None:
        from streamrl.admin.server import start_admin
        from streamrl.controller.live import LiveRun

        self.live = LiveRun(
            config=self.config,
            state=self.state,
            policy=self.policy,
            learners=lambda: self.learners,
            figures=self,
            request_stop=self.request_stop,
            checkpoint_dir=self.run_dir / "checkpoints",
            shard_endpoints=shard_request_endpoints,
        )
        self.admin = start_admin(
            self.live,
            self.config.admin,
            self.run_dir,
            on_event=lambda kind, fields: self.metrics.event(kind, **fields),
        )
        print(
            f"admin: {self.admin.url} (token in {self.run_dir / 'admin.token'})",
            file=self.console,
            flush=True,
        )

    def steps_per_s(self, window: int = 10) -> float:
        times = self._step_times[-window:]
        return (
            (len(times) - 1) / (times[-1] - times[0])
            if len(times) > 1 and times[-1] > times[0]
            else 0.0
        )

    def role_health(self, now: float) -> dict[str, dict[str, Any]]:
        """Every role: alive, its newest heartbeat or report, restarts and last failure."""
        import ray

        running = set()
        if self._watched:
            _, not_done = ray.wait(list(self._watched), timeout=0, num_returns=len(self._watched))
            running = {self.roles.get(ref) for ref in not_done}
        roles = [*self.roles.values(), *(f"generator {g}" for g in sorted(self.pool.slots))]
        state = self.state
        with state.lock:
            return {
                role: {
                    "alive": role in running or role.startswith("generator "),
                    "last_heartbeat": state.last_seen.get(role),
                    "restarts": state.restarts.get(role, 0),
                    "last_failure": state.failures.get(role, ""),
                }
                for role in roles
            }

    def note(self, message: str) -> None:
        """A supervision event, for the console and the controller's log."""
        log.warning("%s", message)
        print(message, file=self.console, flush=True)

    def count_restart(self, role: str, failure: str) -> int:
        """One more restart of ``role`` (why: ``failure``); its restarts so far. Raises a
        one-line RunError once they exceed ``run.max_restarts``."""
        restarts, limit = self.state.count_restart(role, failure), self.config.run.max_restarts
        if restarts > limit:
            raise RunError(
                f"{role} failed {restarts} times (run.max_restarts={limit}); last: {failure} "
                f"(see {self.run_dir / 'logs'})"
            )
        return restarts

    def shard_spec(self, shard_id: int, ports: tuple[int, int] = (0, 0)) -> ShardSpec:
        return ShardSpec(
            log_file=self._log_file(f"buffer-{shard_id}"),
            bind_host=self.bind_host,
            config=self.config.buffer,
            shard_id=shard_id,
            log_dir=str((self.run_dir / "buffer").resolve()),
            report_endpoint=self.report_endpoint,
            ingest_port=ports[0],
            request_port=ports[1],
            vocab_size=_vocab_size(Path(self.model_dir)),
        )

    def learner_spec(
        self, rank: int, ports: tuple[int, int] = (0, 0), incarnation: int = 0
    ) -> LearnerSpec:
        config = self._role_config("learner", rank)
        if any(ports):  # a restarted group: it goes on from the newest checkpoint
            config = msgspec.structs.replace(
                config, run=msgspec.structs.replace(config.run, resume=True)
            )
        return LearnerSpec(
            log_file=self._log_file(f"learner-{rank}"),
            bind_host=self.bind_host,
            cores=self._cores("learner", rank),
            config=config,
            rank=rank,
            world_size=self.config.learner.count,
            model_dir=self.model_dir,
            shard_endpoints=[req for _, req in self.shard_endpoints],
            report_endpoint=self.report_endpoint,
            checkpoint_dir=str((self.run_dir / "checkpoints").resolve()),
            pub_port=ports[0],
            anchor_port=ports[1],
            incarnation=incarnation,
            encoder_cores=self.available_cores if self.cores else None,
            forks=list(self.state.forks),
        )

    def generator_spec(self, generator_id: int, incarnation: int) -> GeneratorSpec:
        return GeneratorSpec(
            log_file=self._log_file(f"generator-{generator_id}"),
            bind_host=self.bind_host,
            cores=self._cores("generator", generator_id),
            config=self._role_config("generator", generator_id),
            generator_id=generator_id,
            model_dir=self.model_dir,
            shard_endpoints=[ingest for ingest, _ in self.shard_endpoints],
            publisher_endpoints=[p for p, _ in self.weight_endpoints],
            anchor_endpoints=[a for _, a in self.weight_endpoints],
            admission_endpoint=self.admission.endpoint,
            report_endpoint=self.report_endpoint,
            incarnation=incarnation,
        )

    def request_stop(self) -> None:
        """Graceful stop: no new groups start, learners finish their current step, the model
        is exported and every process ends."""
        if not self.stopping:
            self.stopping = True
            self.state.stop = True
            for learner in self.learners:
                learner.stop.remote()

    def _cores(self, role: str, index: int) -> list[int] | None:
        sets = self.cores.get(role)
        return sets[index % len(sets)] if sets else None  # generators added live share

    def _role_config(self, role: str, index: int) -> Config:
        """The run's config as one role instance sees it: its torch threads resolved."""
        threads = self._threads(role, index)
        section = getattr(self.config, role)
        return msgspec.structs.replace(
            self.config, **{role: msgspec.structs.replace(section, threads=threads)}
        )

    def _threads(self, role: str, index: int) -> int:
        return role_threads(self.config, role, self._cores(role, index), len(self.available_cores))

    def _log_file(self, role: str) -> str:
        return str((self.run_dir / "logs" / f"{role}.log").resolve())

    def _run(self, model_dir: str) -> dict[str, Any]:
        import ray

        from streamrl.controller.actors import BufferShardActor

        cfg = self.config
        self.model_dir = model_dir
        shards = [
            BufferShardActor.options(**self.placement.options("buffer", 0)).remote(
                self.shard_spec(i)
            )
            for i in range(cfg.buffer.shards)
        ]
        self.actors += shards
        self.shards = shards
        self.shard_endpoints = ray.get([s.endpoints.remote() for s in shards])
        serve_refs = [s.serve.remote() for s in shards]
        self._start_admin([req for _, req in self.shard_endpoints])
        if self.cores:
            print(f"cpu pinning: {describe_split(self.cores)}", file=self.console, flush=True)
        cpu_roles = [r for r in ("learner", "generator") if getattr(cfg, r).device == "cpu"]
        if cpu_roles:
            split = ", ".join(f"{r} {self._threads(r, 0)}" for r in cpu_roles)
            print(
                f"torch threads per process: {split} ({len(self.available_cores)} cores here)",
                file=self.console,
                flush=True,
            )
        self.learners = self._start_learners()
        learners = self.learners
        self.actors += learners
        self.weight_endpoints = self._setup_learners()
        start_version = ray.get(learners[0].version.remote())
        if start_version:
            # Resumed: the budget of the batches already trained on is spent, and the prompt
            # stream continues where it was (prompts.json), not from its start.
            self.state.version = start_version
            self._restore_admission(start_version)
            self.state.prompts = load_prompt_ledger(self.run_dir, start_version)
            print(
                f"resumed at version {start_version}, prompt "
                f"{self.state.prompts.next_index} of the stream",
                file=self.console,
                flush=True,
            )
        if cfg.eval.every > 0 and cfg.eval.before_train:
            self.state.eval_requested = start_version  # generator 0's first call evaluates
        for g in range(cfg.generator.count):
            self.pool.start(g)
        self.pids = ray.get([a.pid.remote() for a in self.actors])
        self._role_names = [
            *(f"buffer shard {i}" for i in range(len(shards))),
            *(f"learner rank {r}" for r in range(len(learners))),
        ]
        self.pool.pids(wait=True)
        # Operators (and tests) can see exactly which processes this run owns.
        self._write_pids()
        learner_refs = [learner.run.remote(cfg.run.max_steps) for learner in learners]
        self.learner_refs = learner_refs
        self.roles = dict(zip([*serve_refs, *learner_refs], self._role_names, strict=True))
        print(
            f"run {cfg.run.name}: {cfg.learner.count} learner(s), {cfg.generator.count} "
            f"generator(s), {cfg.buffer.shards} buffer shard(s), mode {cfg.run.mode}; "
            f"logs in {self.run_dir / 'logs'}",
            file=self.console,
            flush=True,
        )

        self._watched = learner_refs + serve_refs
        self._loop(self._watched)
        # Learners are done: stop admission, let generators drain to the final version.
        self.state.stop = True
        self._wait_generators()
        ray.get([learner.final_checkpoint.remote() for learner in learners])
        with self.state.lock:  # the final checkpoint holds every step; pushes are all in
            self.state.prompts.checkpointed(self.state.version)
        self._save_prompts()
        hf_dir = str((self.run_dir / "hf").resolve())
        ray.get([learner.export_hf.remote(hf_dir) for learner in learners])
        self._refresh_shard_stats()
        return self._summary()

    def _refresh_shard_stats(self) -> None:
        """Ask every shard for its figures now (its periodic report may be a second old)."""
        from streamrl.buffers.client import BufferClient

        client = BufferClient([req for _, req in self.shard_endpoints], name="controller")
        try:
            for stats in client.stats():
                if stats is not None:
                    self.state.shards[stats.shard_id] = stats
        finally:
            client.close()

    def _write_pids(self) -> None:
        """``pids.json``: every process this run started, by role (replacements included)."""
        self.pool.pids()  # refreshes each slot's pid
        by_role = {
            **dict(zip(self._role_names, self.pids, strict=True)),
            **{
                f"generator {generator_id}": slot.pid
                for generator_id, slot in self.pool.slots.items()
                if slot.pid and slot.pid > 0
            },
        }
        self._all_pids.update(by_role.values())
        text = json.dumps(
            {"controller": os.getpid(), "roles": sorted(self._all_pids), "by_role": by_role}
        )
        if text != self._pids_text:
            self._pids_text = text
            write_whole(self.run_dir / "pids.json", text)

    def _loop(self, watched: list) -> None:
        while True:
            try:
                self._record_reports()
                if self._check_roles(watched):
                    # A restart held this loop: take the heartbeats queued meanwhile before
                    # judging any generator silent.
                    self._drain_reports(timeout_ms=0)
                self.pool.check()
                if any(slot.pid is None for slot in self.pool.slots.values()):
                    self._write_pids()  # a generator started or replaced: it is ours too
                if not any(ref in watched for ref in self.learner_refs):
                    self._record_reports()  # the last step's report may still be in flight
                    return
            except KeyboardInterrupt:
                if self.stopping:
                    raise
                print(
                    "stopping: finishing the current step (Ctrl-C again to abort)",
                    file=self.console,
                    flush=True,
                )
                self.request_stop()

    def _record_reports(self) -> None:
        self._drain_reports(timeout_ms=200)
        if self._steps:
            # Steps drained together share one rate: reports from several sockets arrive in
            # no fixed order, so the tokens cannot be split among them.
            rate = self.step_tokens_per_s(self._steps[-1].time)
            for step in self._steps:
                self.last_record = step_record(self.state, step, rate)
                self.metrics.write(self.last_record)
            self._save_prompts()
        self._steps = []
        self._watch_drops()

    def _watch_drops(self) -> None:
        """One console line when groups keep arriving and none is accepted (``DropWatch``)."""
        shards = list(self.state.shards.values())
        dropped: dict[str, int] = collections.Counter()
        accepted = 0
        for s in shards:
            by_reason = (
                {k: n for k, n in s.removed_total.items() if k != "consumed"}
                if s.received_total
                else dict(s.dropped)
            )
            accepted += (s.received_total or s.ingested) - sum(by_reason.values())
            by_reason.pop("invalid", None)  # said by reason instead
            dropped.update(by_reason)
            dropped.update({f"invalid ({k})": n for k, n in s.invalid.items()})
        errors = sum(g.reward_errors for g in self.state.all_generator_reports())
        line = self.drop_watch.observe(
            time.monotonic(), accepted=accepted, dropped=dropped, reward_errors=errors
        )
        if line is not None:
            self.note(line)

    def _save_prompts(self) -> None:
        """``prompts.json``: where a resumed run's prompt stream goes on (``PromptLedger``)."""
        with self.state.lock:
            ledger = self.state.prompts.snapshot()
        write_whole(self.run_dir / "prompts.json", json.dumps(ledger))

    def _check_roles(self, watched: list) -> bool:
        """Restart a buffer shard or the learner group when one's loop ended with an error
        (says whether it did); raise a one-line RunError for anything else."""
        import ray

        done, _ = ray.wait(watched, timeout=0)
        restarted = False
        for ref in done:
            if ref not in watched:  # an old learner rank's, gone with its group's restart
                continue
            watched.remove(ref)
            try:
                ray.get(ref)
            except ray.exceptions.RayError as exc:
                role = self.roles.get(ref, "a role")
                if role.startswith("buffer shard ") and not self.stopping:
                    watched.append(self._restart_shard(int(role.rsplit(" ", 1)[1]), exc))
                    restarted = True
                    continue
                if role.startswith("learner rank ") and not self.stopping:
                    self._restart_learners(int(role.rsplit(" ", 1)[1]), exc, watched)
                    restarted = True
                    continue
                raise RunError(
                    f"{role} failed: {last_line(exc)} (see {self.run_dir / 'logs'})"
                ) from None
        return restarted

    def _start_learners(
        self, ports: list[tuple[int, int]] | None = None, incarnation: int = 0
    ) -> list[Any]:
        from streamrl.controller.actors import LearnerActor

        count = self.config.learner.count
        return [
            LearnerActor.options(**self.placement.options("learner", r)).remote(
                self.learner_spec(r, ports[r] if ports else (0, 0), incarnation)
            )
            for r in range(count)
        ]

    def _setup_learners(self) -> list[tuple[str, str]]:
        """Form the process group; every rank's (PUB, anchor) endpoints."""
        import ray

        master = ray.get(self.learners[0].rendezvous_address.remote())
        return ray.get([learner.setup.remote(master) for learner in self.learners])

    def _restart_learners(self, rank: int, exc: Exception, watched: list) -> None:
        """A learner rank died: the whole group (the others are stuck in a collective) starts
        again from the newest checkpoint, on the same weight ports. Versions go on from the
        checkpoint's; generators keep generating meanwhile and re-anchor when admission tells
        them the group's new epoch. The groups the lost steps consumed return to the budget.
        Without a checkpoint the run fails at once, naming the rank."""
        import ray

        rank, failure = self._first_failed_rank(rank, exc)
        role, limit, logs = "learner group", self.config.run.max_restarts, self.run_dir / "logs"
        checkpoint = latest_checkpoint(self.run_dir / "checkpoints")
        if checkpoint is None:
            raise RunError(
                f"learner rank {rank} failed: {failure}; no checkpoint to restart from "
                f"(run.checkpoint_every={self.config.run.checkpoint_every}; see {logs})"
            )
        failure = f"learner rank {rank}: {failure}"
        restarts = self.count_restart(role, failure)
        lost_version = self.state.version
        old_refs = list(self.learner_refs)
        for learner in self.learners:
            with contextlib.suppress(Exception):
                ray.kill(learner, no_restart=True)
        # Their weight ports are free once the processes are gone.
        ray.wait(old_refs, num_returns=len(old_refs), timeout=30)
        for ref in old_refs:
            if ref in watched:
                watched.remove(ref)
            self.roles.pop(ref, None)
        ports = [_ports(pair) for pair in self.weight_endpoints]
        n_shards = len(self.shards)
        # Its reports carry the epoch _roll_back_budget moves to; the old group's are ignored.
        self.learners[:] = self._start_learners(ports, self.state.weights_epoch + 1)
        self.actors[n_shards : n_shards + len(self.learners)] = self.learners
        endpoints = [tuple(pair) for pair in self._setup_learners()]
        if endpoints != [tuple(pair) for pair in self.weight_endpoints]:
            raise RunError(f"{role}: the restarted group bound {endpoints}")
        version = ray.get(self.learners[0].version.remote())
        prompts_again = self._roll_back_budget(version)
        self.pids[n_shards : n_shards + len(self.learners)] = ray.get(
            [a.pid.remote() for a in self.learners]
        )
        self._write_pids()
        max_steps = self.config.run.max_steps
        self.learner_refs = [learner.run.remote(max_steps) for learner in self.learners]
        for r, ref in enumerate(self.learner_refs):
            self.roles[ref] = f"learner rank {r}"
            watched.append(ref)
        self.note(
            f"{failure}; learner group restarted from {checkpoint.name} "
            f"(version {version}, was {lost_version}; restart {restarts}/{limit})"
        )
        self.metrics.event(
            "restart",
            role=role,
            failure=failure,
            restarts=restarts,
            version=version,
            prompts_again=prompts_again,
        )

    def _first_failed_rank(self, rank: int, exc: Exception) -> tuple[int, str]:
        """The rank whose process died, rather than a survivor whose collective broke with it
        (gloo's "connection reset" often ends first): waits up to 2 s for every rank."""
        import ray

        done, _ = ray.wait(self.learner_refs, num_returns=len(self.learner_refs), timeout=2)
        failures = {self.learner_refs.index(ref): ref for ref in done}
        for r, ref in sorted(failures.items()):
            try:
                ray.get(ref)
            except ray.exceptions.RayError as err:
                if "process died" in last_line(err):
                    return r, last_line(err)
        return rank, last_line(exc)

    def _restore_admission(self, version: int) -> None:
        """A resumed run's admission count, exact from the shards' durable logs: every group a
        log received was started; those consumed by steps after the checkpoint went with those
        steps and return to the budget, as drops do. Without a log: ``version`` full batches."""
        self._refresh_shard_stats()
        received = sum(s.received_total for s in self.state.shards.values())
        with self.state.lock:
            if not received:
                self.policy.started = version * self.config.learner.groups_per_step
                return
            self.policy.started = received
            self.policy.set_dropped(self.state.buffer_dropped())
            self._give_back_lost_steps(version)

    def _give_back_lost_steps(self, version: int) -> None:
        """Groups consumed by steps after ``version`` went with those steps: counted as rolled
        back (once) and returned to the budget. Call with ``state.lock`` held, shard stats
        fresh."""
        gps = self.config.learner.groups_per_step
        consumed = sum(s.removed_total.get("consumed", 0) for s in self.state.shards.values())
        lost = max(0, consumed - version * gps - self._rolled_back)
        self._rolled_back += lost
        self.policy.give_back(lost)

    def _roll_back_budget(self, version: int) -> list[int]:
        """The learners are back at ``version``, in a new epoch: the groups taken for steps
        after it are gone with those steps, so their budget returns and generators make new
        ones, for the same prompts (returned).

        The shards' take receipts say exactly what those steps took, reports or not (a rank
        may die before its ``BatchTaken`` leaves, or with a take parked at a shard). So the
        shards hear the new epoch first (``BufferClient.announce``: they drop groups sampled
        from weights it took back and cancel the dead group's parked takes, so no receipt
        comes after), then their receipts are read."""
        from streamrl.buffers.client import BufferClient

        dead_epoch = self.state.weights_epoch
        forks = [*self.state.forks, version]
        endpoints = [req for _, req in self.shard_endpoints]
        client = BufferClient(endpoints, name="controller", epoch=dead_epoch + 1, forks=forks)
        try:
            answered = client.announce(version)
        finally:
            client.close()
        if len(answered) < len(endpoints):
            log.warning("learner epoch %d: shards %s did not answer", dead_epoch + 1, answered)
        self._refresh_shard_stats()
        receipts = [
            r
            for stats in self.state.shards.values()
            for r in getattr(stats, "receipts", [])
            if r.epoch == dead_epoch and r.step > version
        ]
        with self.state.lock:
            self.state.version = version
            self.state.weights_epoch += 1
            self.state.forks = forks
            return self._give_back_taken(version, receipts)

    def _give_back_taken(self, version: int, receipts: list[TakeReceipt]) -> list[int]:
        """Return to the budget every group the receipts name (taken by lost steps), and
        their prompts to the stream, first; returns those prompts. Call with
        ``state.lock`` held. Steps whose receipts a restarted shard lost are still known from
        the learners' ``BatchTaken`` reports (the ledger) and the durable log's counts."""
        taken = sum(len(r.prompt_indices) for r in receipts)
        from_receipts = [i for r in receipts for i in r.prompt_indices if i >= 0]
        before = self._rolled_back
        self._give_back_lost_steps(version)  # the durable log's count, if it sees more
        counted = self._rolled_back - before
        if taken > counted:
            self.policy.give_back(taken - counted)
            self._rolled_back += taken - counted
        elif counted > taken:
            log.warning(
                "learner restart: the logs count %d groups taken by lost steps, the "
                "receipts %d (a shard restarted meanwhile?)",
                counted,
                taken,
            )
        return self.state.prompts.roll_back(version, extra=from_receipts)

    def _restart_shard(self, shard_id: int, exc: Exception) -> Any:
        """A new process for a dead shard, on its durable log and its predecessor's ports
        (generators' and learners' sockets reconnect by themselves); returns its serve ref.
        What the log held is recovered; a group in a reply that was on the wire is lost."""
        import ray

        from streamrl.controller.actors import BufferShardActor

        role, limit = f"buffer shard {shard_id}", self.config.run.max_restarts
        failure, logs = last_line(exc), self.run_dir / "logs"
        if not self.config.buffer.durable:
            raise RunError(f"{role} failed: {failure} (buffer.durable is off; see {logs})")
        restarts = self.count_restart(role, failure)
        with contextlib.suppress(Exception):  # already gone
            ray.kill(self.shards[shard_id], no_restart=True)
        actor = BufferShardActor.options(**self.placement.options("buffer", 0)).remote(
            self.shard_spec(shard_id, _ports(self.shard_endpoints[shard_id]))
        )
        endpoints = tuple(ray.get(actor.endpoints.remote()))
        if endpoints != tuple(self.shard_endpoints[shard_id]):
            raise RunError(f"{role} restarted at {endpoints}, not {self.shard_endpoints[shard_id]}")
        self.shards[shard_id] = self.actors[shard_id] = actor
        with self.state.lock:  # generators resend what the dead process had not logged
            self.state.shard_epochs[shard_id] = self.state.shard_epochs.get(shard_id, 0) + 1
        self.pids[shard_id] = ray.get(actor.pid.remote())
        self._write_pids()
        ref = actor.serve.remote()
        self.roles[ref] = role
        self.note(f"{role}: {failure}; restarted on its log (restart {restarts}/{limit})")
        self.metrics.event("restart", role=role, failure=failure, restarts=restarts)
        return ref

    def tokens_per_s(self, window_s: float = 10.0) -> float:
        """Generated tokens per second over at least the last ``window_s`` of generator
        reports: from the newest report at or before the window's start (a generator that
        reports once per 30 s call still gets a rate, not 0)."""
        samples = self._token_samples
        if len(samples) < 2:
            return 0.0
        end_t, end_n = samples[-1]
        before = [(t, n) for t, n in samples if t <= end_t - window_s]
        start_t, start_n = before[-1] if before else samples[0]
        if end_t - start_t < 0.2:  # too short a span to be a rate
            return 0.0
        return (end_n - start_n) / max(end_t - start_t, 1e-6)

    def step_tokens_per_s(self, now: float) -> float:
        """Generated tokens per second since the previous step record was written (since the
        first generator report, for step 1). Unlike the rolling ``tokens_per_s``, a sync step whose
        training alone outlasts the window still shows the rate its generation ran at."""
        total = sum(g.tokens_generated for g in self.state.all_generator_reports())
        if self._last_step_tokens is None:
            self._last_step_tokens = self._token_samples[0] if self._token_samples else (now, 0)
        start_t, start_n = self._last_step_tokens
        self._last_step_tokens = (now, total)
        return (total - start_n) / (now - start_t) if now > start_t else 0.0

    def _drain_reports(self, timeout_ms: int) -> None:
        if not self.report_sock.poll(timeout_ms):
            return
        while True:
            try:
                report = self.report_codec.decode(self.report_sock.recv(zmq.NOBLOCK))
            except zmq.Again:
                return
            match report:
                case LearnerStep() as step:
                    if not self._current_learner_report(step):
                        continue
                    self.state.version = step.version
                    if "checkpoint/version" in step.metrics:
                        with self.state.lock:
                            self.state.prompts.checkpointed(step.version)
                    self._maybe_request_eval(step.version)
                    self._step_times.append(step.time)
                    self.state.last_seen["learner rank 0"] = step.time
                    self._steps.append(step)
                case BatchTaken() as taken:
                    if not self._current_learner_report(taken):
                        continue
                    with self.state.lock:
                        self.state.prompts.taken(taken.version, taken.prompt_indices)
                case GeneratorReport() as g:
                    if not self.state.generator_report(g):
                        continue  # from a replaced incarnation
                    total = sum(r.tokens_generated for r in self.state.all_generator_reports())
                    self._token_samples.append((g.time, total))
                case Heartbeat() as beat:
                    self.state.heartbeat(beat)
                case EvalReport() as report:
                    self.state.eval_answered = max(self.state.eval_answered, report.requested)
                    self.evals.append(report)
                    self.metrics.eval(report.requested, report.version, report.metrics)
                case ShardReport(stats=stats) as report:
                    self.state.shards[stats.shard_id] = stats
                    self.state.last_seen[f"buffer shard {stats.shard_id}"] = report.time
                    with self.state.lock:
                        self.policy.set_dropped(self.state.buffer_dropped())

    def _current_learner_report(self, report: LearnerStep | BatchTaken) -> bool:
        """Whether ``report`` comes from the current learner group and names a version it can
        reach; others (a replaced group's late reports, versions out of range) are counted in
        ``ignored_reports`` and logged once per kind."""
        state, max_steps = self.state, self.config.run.max_steps
        lowest = state.version + 1 if isinstance(report, LearnerStep) else 1
        if report.incarnation != state.weights_epoch:
            why, detail = "from a replaced learner group", ""
        elif not lowest <= report.version <= max_steps:
            why, detail = "version out of range", f" [{lowest}, {max_steps}]"
        else:
            return True
        name = type(report).__name__
        kind = f"{name}: {why}"
        if kind not in self.ignored_reports:
            log.warning("ignored a %s %s%s (version %d)", name, why, detail, report.version)
        self.ignored_reports[kind] = self.ignored_reports.get(kind, 0) + 1
        return False

    def _maybe_request_eval(self, version: int) -> None:
        """Every ``eval.every`` versions (the final one is evaluated as generators drain)."""
        every = self.config.eval.every
        if every > 0 and version % every == 0 and version < self.config.run.max_steps:
            self.state.eval_requested = max(self.state.eval_requested, version)

    def _wait_generators(self) -> None:
        import ray

        deadline = time.time() + self.config.run.drain_timeout_s + 30
        while self.pool.slots and time.time() < deadline:
            self._drain_reports(timeout_ms=100)
            self.pool.check()  # forgets the finished; kills the silent
            ray.wait(self.pool.run_refs(), timeout=0.1)
        self._drain_reports(timeout_ms=300)

    def _summary(self) -> dict[str, Any]:
        summary = run_summary(
            self.state,
            durable=self.config.buffer.durable,
            rolled_back=self._rolled_back,
            ignored_reports=self.ignored_reports,
            evals=self.evals,
            run_dir=self.run_dir,
            wall_time_s=time.time() - self.started_at,
        )
        (self.run_dir / "summary.json").write_bytes(msgspec.json.encode(summary))
        print(outcome(summary), file=self.console, flush=True)
        return summary

    def shutdown(self) -> None:
        import ray

        if self.admin is not None:
            self.admin.stop()
        if self.live is not None:
            self.live.close()
        self.pool.kill_all()
        for actor in self.actors:
            try:
                ray.kill(actor)
            except Exception:  # already gone
                pass
        if self.admission is not None:
            self.admission.close()
        self.ctx.destroy(linger=0)
        if getattr(self, "metrics", None):
            self.metrics.close()
        if ray.is_initialized():
            ray.shutdown()
        if self.address is None:
            _reap(self._all_pids)


def _ports(endpoints: tuple[str, str] | list[str]) -> tuple[int, int]:
    """The two ports of a role's endpoint pair (``tcp://host:port``), to bind again."""
    first, second = (int(endpoint.rsplit(":", 1)[1]) for endpoint in endpoints)
    return first, second


def _reap(pids: set[int], timeout_s: float = 10.0) -> None:
    """Local mode: the run's own role processes (by pid) are gone when ``launch`` returns; an
    actor killed moments ago may still be exiting, so wait for it, then SIGKILL what is left."""
    deadline = time.monotonic() + timeout_s
    left = set(pids)
    while left:
        for pid in list(left):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                left.discard(pid)
            except PermissionError:  # the pid was reused by someone else's process
                left.discard(pid)
        if not left:
            return
        if time.monotonic() > deadline:
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            return
        time.sleep(0.1)


def _vocab_size(model_dir: Path) -> int:
    """The model's vocabulary (its embedding rows), from its config.json; 0 if unknown."""
    try:
        return int(json.loads((model_dir / "config.json").read_text()).get("vocab_size", 0))
    except (OSError, ValueError, TypeError):
        return 0


def _check_engine(config: Config, model_dir: Path) -> None:
    from streamrl.workers.engines import EngineUnavailable, check_engine

    try:
        check_engine(config.generator, model_dir)
    except EngineUnavailable as exc:
        raise RunError(str(exc)) from None


def _sigterm_as_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def launch(config: Config, address: str | None = None, console=sys.stdout) -> dict[str, Any]:
    """Run one job to ``run.max_steps``; returns a summary (also written to summary.json).
    Ctrl-C or SIGTERM stops gracefully (the model is still exported); a second one aborts."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return Controller(config, address, console).run()
    except KeyboardInterrupt:
        raise RunError("aborted") from None
