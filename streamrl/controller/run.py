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
and ends every process it started. It reads top-down: ``run`` checks the input
(``preflight``), ``_start`` places every role, ``_loop`` watches them until the learners
finish, ``_finish`` drains the generators and exports. Its collaborators share a
``RunContext``, never the controller:

| owner                          | owns                                                      |
|--------------------------------|-----------------------------------------------------------|
| ``roles.Roles``                | one slot per role: actor, loop ref, pid, endpoints        |
| ``supervisor.GeneratorPool``   | starting, replacing, scaling generators                    |
| ``recovery.Recovery``          | restarting a buffer shard or the learner group             |
| ``resume``                     | ``--resume``: the clock's fork, budget and prompts restored |
| ``intake.ReportIntake``        | reports -> ``RunState`` methods; rate windows              |
| ``state.RunState``             | what is known, and the budget rules (pure methods)         |
"""

from __future__ import annotations

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

from streamrl.admin.audit import AuditLog
from streamrl.admin.auth import AUDIT_FILE
from streamrl.config import Config
from streamrl.controller import resume
from streamrl.controller.admission import AdmissionServer
from streamrl.controller.context import RunContext
from streamrl.controller.drops import DropWatch
from streamrl.controller.intake import ReportIntake
from streamrl.controller.placement import Placement, describe_split, init_ray
from streamrl.controller.preflight import Checked, preflight
from streamrl.controller.records import outcome, run_summary, step_record
from streamrl.controller.recovery import (
    Recovery,
    run_learners,
    start_learner_group,
    start_shard,
)
from streamrl.controller.retention import Retention
from streamrl.controller.reward_roles import RewardPool
from streamrl.controller.roles import Roles
from streamrl.controller.rundir import (
    RunError,
    last_line,
    prepare_run_dir,
)
from streamrl.controller.specs import SpecFactory, bind_host_for
from streamrl.controller.staleness import AdmissionPolicy
from streamrl.controller.staleness_tuner import Decision, StalenessTuner
from streamrl.controller.state import RunState
from streamrl.controller.stopping import rules_for
from streamrl.controller.supervisor import GeneratorPool
from streamrl.eval_answers import AnswersLog
from streamrl.evaluation import evaluates_in_slack
from streamrl.files import atomic_write_text
from streamrl.metrics import MetricsLog
from streamrl.protocol import EvalReport
from streamrl.transport import resolve_host

log = logging.getLogger("streamrl")


class Controller:
    def __init__(
        self,
        config: Config,
        address: str | None = None,
        console=sys.stdout,
        checked: Checked | None = None,
    ) -> None:
        self.config, self.address, self.console = config, address, console
        self.checked = checked  # the pre-flight's findings, when the caller ran it
        self.state = RunState()
        self.policy = AdmissionPolicy(
            config.learner.groups_per_step,
            config.buffer,
            self.state,
            last_step=config.run.max_steps,
        )
        self.state.policy = self.policy
        self.zmq = zmq.Context()
        self.intake = ReportIntake(
            self.state,
            config.run.max_steps,
            config.eval.every,
            on_eval=self._evaluated,
            role_health=lambda now: self.ctx.roles.health(self.state, now),
        )
        self.admission: AdmissionServer | None = None
        self.admin = self.live = None
        tuning = config.buffer.staleness_tuning
        self.tuner = StalenessTuner(tuning) if tuning.auto else None
        self.placement = Placement(config, address)
        self.drop_watch = DropWatch()
        self.stop_rules = rules_for(config)
        self.stopped_because = ""  # a stop rule's reason, when one ended the run
        self.started_at = time.time()
        self.available_cores = sorted(os.sched_getaffinity(0))

    # ------------------------------------------------------------------ the run

    def run(self) -> dict[str, Any]:
        from streamrl.controller.difficulty import DifficultySampler
        from streamrl.models.lora import uses_lora, write_initial_adapter

        cfg = self.config
        try:
            # Everything that can fail on bad input fails here, before any process starts:
            # the one list ``streamrl validate`` runs too (the CLI ran it already: ``checked``).
            checked = self.checked
            if checked is None or checked.model_dir is None:  # not run, or without models
                checked = preflight(cfg, address=self.address, available_cores=self.available_cores)
            if checked.data_line:
                print(checked.data_line, file=self.console, flush=True)
            self.state.difficulty = DifficultySampler.of(cfg)
            model_dir = str(checked.model_dir)
            self.scorer_dirs = checked.scorer_dirs
            cores = checked.cores
            run_dir = prepare_run_dir(cfg)
            if uses_lora(cfg):
                write_initial_adapter(cfg, Path(model_dir), run_dir)
            self.ctx = RunContext(
                config=cfg,
                state=self.state,
                policy=self.policy,
                placement=self.placement,
                roles=Roles(),
                specs=SpecFactory(
                    cfg,
                    run_dir,
                    model_dir,
                    bind_host_for(self.address),
                    cores=cores,
                    available_cores=self.available_cores,
                ),
                run_dir=run_dir,
                metrics=MetricsLog(run_dir / "metrics.jsonl", self.console, cfg),
                console=self.console,
            )
            self.retention = Retention(
                run_dir,
                cfg.run.keep_checkpoints,
                cfg.eval.keep_best,
                self.stop_rules.metric,
                lambda: [e for e in self.intake.evals if self.state.eval_is_live(e)],
            )
            init_ray(self.address)
            import ray

            self._open_control_plane()
            if threading.current_thread() is threading.main_thread():
                # After ray.init, which installs a SIGTERM handler of its own that exits at once.
                signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
            try:
                self._start()
                self._loop()
                return self._finish()
            except ray.exceptions.RayError as exc:  # a role failed to start
                raise RunError(f"{last_line(exc)} (see {run_dir / 'logs'})") from None
        finally:
            self.shutdown()

    def _open_control_plane(self) -> None:
        """Report and admission sockets; on a cluster they bind this node's address so roles
        on other nodes reach them (after ray.init, which knows that address)."""
        host = resolve_host(bind_host_for(self.address))
        specs = self.ctx.specs
        specs.report_endpoint = self.intake.open(self.zmq, host)
        in_order = evaluates_in_slack(self.config)
        probes = self.config.generator.probe_candidates  # prompts offered per granted group
        self.admission = AdmissionServer(self.zmq, self.policy, self.state, host, in_order, probes)
        specs.admission_endpoint = self.admission.endpoint

    def _start(self) -> None:
        """Shards, then the learner group (resumed from a checkpoint if asked), then the
        generators; then the learners' loops."""
        import ray

        ctx, cfg, state = self.ctx, self.config, self.state
        self.pool, self.recovery = GeneratorPool(ctx), Recovery(ctx)
        self.rewards = RewardPool(ctx, self.scorer_dirs)
        ctx.specs.shard_endpoints = [
            start_shard(ctx, i).endpoints for i in range(cfg.buffer.shards)
        ]
        self.rewards.launch_all()  # their scorers load while the learners do
        self._start_admin()
        if ctx.specs.cores:
            print(f"cpu pinning: {describe_split(ctx.specs.cores)}", file=self.console, flush=True)
        cpu_roles = [r for r in ("learner", "generator") if getattr(cfg, r).device == "cpu"]
        if cpu_roles:
            split = ", ".join(f"{r} {ctx.specs.threads(r, 0)}" for r in cpu_roles)
            n = len(self.available_cores)
            print(
                f"torch threads per process: {split} ({n} cores here)",
                file=self.console,
                flush=True,
            )
        # A resume is a new epoch (``streamrl.clock``) forked at the checkpoint.
        checkpoint = resume.fork_clock(ctx) if cfg.run.resume else None
        ctx.start_epoch(state.weights_epoch, state.forks)
        learners = start_learner_group(ctx, epoch=state.weights_epoch)
        ctx.specs.weight_endpoints = [slot.endpoints for slot in learners]
        self.rewards.launch_followers()  # lagged teachers subscribe to the learners' weights
        start_version = ray.get(learners[0].actor.version.remote())
        if cfg.run.resume:
            resume.restore(ctx, start_version, checkpoint is not None)
        if cfg.eval.every > 0 and cfg.eval.before_train:
            with state.lock:
                state.ask_eval(start_version)  # generator 0's first call evaluates
        ctx.specs.reward_endpoints = self.rewards.await_ready()
        for g in range(cfg.generator.count):
            self.pool.start(g)
        ctx.roles.refresh_pids(wait=True)
        ctx.write_pids()  # operators (and tests) see exactly which processes are this run's
        run_learners(ctx)
        print(
            f"run {cfg.run.name}: {cfg.learner.count} learner(s), {cfg.generator.count} "
            f"generator(s), {cfg.buffer.shards} buffer shard(s), mode {cfg.run.mode}; "
            f"logs in {ctx.run_dir / 'logs'}",
            file=self.console,
            flush=True,
        )

    def _start_admin(self) -> None:
        from streamrl.controller.live import start_live_admin

        self.live, self.admin = start_live_admin(self.ctx, self.intake, self.request_stop)

    def _loop(self) -> None:
        """Until every learner rank's loop ended: reports in, records out, dead roles
        restarted, generators supervised. Ctrl-C asks for a graceful stop."""
        while True:
            try:
                self._record_reports()
                restarted = self.recovery.check_roles(self._record_reports) or self.rewards.check()
                if restarted:
                    # A restart held this loop: take the heartbeats queued meanwhile, and
                    # count silence from now (``Roles.listening_since``).
                    self.intake.drain(timeout_ms=0)
                    self.ctx.roles.listening_since = time.time()
                self.pool.check()
                self.ctx.write_pids()  # a generator started or replaced: it is ours too
                if not restarted and self._learners_finished():
                    self._record_reports()  # the last step's report may still be in flight
                    return
            except KeyboardInterrupt:
                if self.state.stop:
                    raise
                print(
                    "stopping: finishing the current step (Ctrl-C again to abort)",
                    file=self.console,
                    flush=True,
                )
                self.request_stop()

    def _learners_finished(self) -> bool:
        """Every rank's loop returned (one that failed is ``Recovery.check_roles``' to handle)."""
        import ray

        refs = self.ctx.roles.run_refs("learner rank")
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        if len(done) < len(refs):
            return False
        try:
            ray.get(done)
        except ray.exceptions.RayError:
            return False
        return True

    def _finish(self) -> dict[str, Any]:
        """Learners are done: stop admission, let generators drain to the final version,
        save the last checkpoint and export the model."""
        import ray

        ctx, state = self.ctx, self.state
        with state.lock:
            state.stop = True
        self._wait_generators()
        self.rewards.stop_all()
        self.intake.drain(timeout_ms=300)  # their last reports
        learners = ctx.roles.actors("learner rank")
        ray.get([learner.final_checkpoint.remote() for learner in learners])
        with state.lock:  # the final checkpoint holds every step; pushes are all in
            state.checkpointed = state.version
            state.prompts.checkpointed(state.version)
        self._save_prompts()
        hf_dir = str((ctx.run_dir / "hf").resolve())
        ray.get([learner.export_hf.remote(hf_dir) for learner in learners])
        self.retention.finish(self.console)
        ctx.refresh_shard_stats()
        return self._summary()

    # ------------------------------------------------------------------ the loop's parts

    def _record_reports(self) -> None:
        self.intake.drain(timeout_ms=200)
        steps = self.intake.take_steps()
        if steps:
            # Steps drained together share one rate: reports from several sockets arrive in
            # no fixed order, so the tokens cannot be split among them.
            rate = self.intake.step_tokens_per_s(steps[-1].time)
            for step in steps:
                record = step_record(self.state, step, rate)
                bound = self.config.buffer.max_staleness
                record["staleness/bound"] = bound
                self.intake.last_record = record
                self.ctx.metrics.write(record)
                if self.tuner is not None:
                    self._retune(self.tuner.observe(record, bound))
            if any("checkpoint/version" in step.metrics for step in steps):
                self.retention.prune()
            if self.state.checkpointed >= 0:  # before any checkpoint a resume starts over
                self._save_prompts()
        now = time.monotonic()
        line = self.drop_watch.observe_state(now, self.state)
        if line is not None:
            self.ctx.note(line)
        self._stop_for(self.stop_rules.starved(now, self.state))

    def _retune(self, decision: Decision | None) -> None:
        """A staleness tuner's decision: through the admin's live path, into the audit trail
        and the metrics log (``controller.staleness_tuner``)."""
        if decision is None or self.live is None:
            return
        key = "buffer.max_staleness"
        self.live.apply_live({key: decision.new})
        fields = {"key": key, "old": decision.old, "new": decision.new}
        fields.update(client="staleness-tuner", reason=decision.reason, figures=decision.figures)
        AuditLog(self.ctx.run_dir / AUDIT_FILE).append(**fields)
        self.ctx.metrics.event("staleness_tuned", **fields)
        log.info("staleness bound %d -> %d (%s)", decision.old, decision.new, decision.reason)

    def _evaluated(self, report: EvalReport) -> None:
        """An evaluation taken: to metrics.jsonl and its answers to answers.jsonl
        (``eval_answers``), then the early-stopping rule."""
        answers = AnswersLog(self.ctx.run_dir).append(report)
        self.ctx.metrics.eval(
            report.requested, report.version, report.metrics, report.weights_epoch, answers
        )
        self._stop_for(self.stop_rules.evaluated(report.metrics))

    def _stop_for(self, reason: str | None) -> None:
        """A stop rule fired (``controller.stopping``): say why, then stop gracefully."""
        if reason is None or self.state.stop:
            return
        self.stopped_because = reason
        self.ctx.note(f"stopping: {reason}")
        self.ctx.metrics.event("stop", reason=reason)
        self.request_stop()

    def _save_prompts(self) -> None:
        """``prompts.json``: where a resumed run's prompt stream goes on (``PromptLedger``)."""
        with self.state.lock:
            ledger = self.state.prompts.snapshot()
        atomic_write_text(self.ctx.run_dir / "prompts.json", json.dumps(ledger))

    def _wait_generators(self) -> None:
        import ray

        deadline = time.time() + self.config.run.drain_timeout_s + 30
        while self.pool.slots and time.time() < deadline:
            self.intake.drain(timeout_ms=100)
            self.pool.check()  # forgets the finished; kills the silent
            ray.wait(self.pool.run_refs(), timeout=0.1)
        self.intake.drain(timeout_ms=300)

    def _summary(self) -> dict[str, Any]:
        summary = run_summary(
            self.state,
            durable=self.config.buffer.durable,
            rolled_back=self.state.rolled_back,
            ignored_reports=self.intake.ignored,
            evals=self.intake.evals,
            run_dir=self.ctx.run_dir,
            wall_time_s=time.time() - self.started_at,
            stopped_because=self.stopped_because,
            best_metric=self.stop_rules.metric,
            model_version=self.retention.model_version,
        )
        (self.ctx.run_dir / "summary.json").write_bytes(msgspec.json.encode(summary))
        print(outcome(summary), file=self.console, flush=True)
        return summary

    # ------------------------------------------------------------------ stop

    def request_stop(self) -> None:
        """Graceful stop: no new groups start, learners finish their current step, the model
        is exported and every process ends. ``RunState.stop`` is the run's one stop flag: the
        admin API's thread and Ctrl-C both come here, and admission reads it."""
        with self.state.lock:
            if self.state.stop:
                return
            self.state.stop = True
        for learner in self.ctx.roles.actors("learner rank"):
            learner.stop.remote()

    def shutdown(self) -> None:
        import ray

        if self.admin is not None:
            self.admin.stop()
        if self.live is not None:
            self.live.close()
        ctx = getattr(self, "ctx", None)
        if ctx is not None:
            ctx.roles.kill_all()
        if self.admission is not None:
            self.admission.close()
        self.intake.close()
        self.zmq.destroy(linger=0)
        if ctx is not None:
            ctx.metrics.close()
        if ray.is_initialized():
            ray.shutdown()
        if self.address is None and ctx is not None:
            ctx.roles.reap()


def _sigterm_as_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def launch(
    config: Config,
    address: str | None = None,
    console=sys.stdout,
    checked: Checked | None = None,
) -> dict[str, Any]:
    """Run one job to ``run.max_steps``; returns a summary (also written to summary.json).
    ``checked``: what ``preflight`` found, when the caller ran it (else the run does, first).
    Ctrl-C or SIGTERM stops gracefully (the model is still exported); a second one aborts."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return Controller(config, address, console, checked).run()
    except KeyboardInterrupt:
        raise RunError("aborted") from None
