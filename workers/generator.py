"""Generator role: sample prompt groups forever and push them to the buffer shards.

Loop (waits for -> unblocked by):
  1. admission for new groups       -> the learner's version advancing (docs/design.md §3)
  2. weights fresh enough for them  -> the subscriber applying the next version
  3. generate (weights applied between decode steps when in-flight updates are on)
  4. reward, push to a shard        -> PUSH blocks only at the shard's high-water mark

Each admission reply has four parts, each handled by one method (``Generator.run``): the
learner clock (``follow_clock``), the delivery receipts (``take_receipts``), the directives
(``obey``: knobs, evaluation, stop or retire) and the grant (``generate_granted``: steps 2-4).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import msgspec
import torch
import zmq

from streamrl.buffers.delivery import Outbox, new_sender, shard_sender
from streamrl.config import Config
from streamrl.cores import role_threads
from streamrl.data import Prompt, PromptStream
from streamrl.hardware import describe_choice, resolve_compute_dtype
from streamrl.models import encode_prompt, load_bf16_image, load_tokenizer, stop_token_ids
from streamrl.protocol import (
    AdmissionReply,
    AdmissionRequest,
    Directives,
    EvalReport,
    GeneratorActivity,
    GeneratorReport,
    Grant,
    Heartbeat,
    LearnerClockInfo,
    Receipts,
    Trajectory,
    TrajectoryGroup,
    pack_int32,
)
from streamrl.rewards import CombinedReward, RewardInput
from streamrl.transport import Codec, make_socket
from streamrl.workers.engines import Engine, SamplingParams, make_engine
from streamrl.workers.engines.base import StepHook
from streamrl.workers.episodes import EpisodeRunner
from streamrl.workers.subscriber import WeightSubscriber

log = logging.getLogger(__name__)

# A leaving generator waits this long at most for the shards' receipts of what it pushed
# (normally under a second: shards report twice a second, admission relays the floors).
RECEIPT_WAIT_S = 10.0
RECEIPT_POLL_S = 0.1

# How a generator's run ends: ``stop`` drains to the learner's final version, ``retire`` not.
Ending = Literal["stop", "retire"]


class AdmissionClient:
    """Asks the controller for permission to start groups (DEALER -> controller ROUTER)."""

    def __init__(
        self,
        ctx: zmq.Context,
        endpoint: str,
        generator_id: int,
        incarnation: int = 0,
        sender: str = "",
    ) -> None:
        self.sock = make_socket(ctx, zmq.DEALER)
        self.sock.connect(endpoint)
        self.generator_id, self.incarnation, self.sender = generator_id, incarnation, sender
        self.codec: Codec[AdmissionReply] = Codec(AdmissionReply, "admission client")

    def request(self, n_groups: int, timeout_s: float = 30.0) -> AdmissionReply:
        request = AdmissionRequest(self.generator_id, n_groups, self.incarnation, self.sender)
        self.sock.send(self.codec.encode(request))
        if not self.sock.poll(int(timeout_s * 1000)):
            raise TimeoutError(f"controller did not answer admission within {timeout_s:.0f}s")
        reply = self.codec.decode(self.sock.recv())
        if reply is None:
            raise RuntimeError("malformed admission reply from the controller")
        return reply


class HeartbeatThread:
    """A ``Heartbeat`` every ``every_s`` from a daemon thread with its own socket (ZeroMQ
    sockets are not thread-safe): the supervisor replaces a generator that goes silent."""

    def __init__(
        self,
        ctx: zmq.Context,
        endpoint: str,
        generator_id: int,
        incarnation: int,
        every_s: float = 1.0,
    ) -> None:
        self.sock = make_socket(ctx, zmq.PUSH, sndhwm=4)
        self.sock.connect(endpoint)
        self.beat = Heartbeat("generator", generator_id, incarnation, 0.0)
        self.every_s = every_s
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="heartbeat")
        self.thread.start()

    def _run(self) -> None:
        encoder = msgspec.msgpack.Encoder()
        while not self._stop.is_set():
            self.beat.time = time.time()
            with contextlib.suppress(zmq.Again):  # the controller is behind: skip this beat
                self.sock.send(encoder.encode(self.beat), zmq.NOBLOCK)
            self._stop.wait(self.every_s)

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=2)
        self.sock.close()


class Generator:
    def __init__(
        self,
        config: Config,
        generator_id: int,
        model_dir: str,
        shard_endpoints: list[str],
        publisher_endpoints: list[str],
        anchor_endpoints: list[str],
        admission_endpoint: str,
        report_endpoint: str,
        *,
        incarnation: int = 0,
        bind_host: str = "127.0.0.1",
    ) -> None:
        gen = config.generator
        # The controller resolves threads (0 = auto); a role built directly resolves its own.
        self.threads = role_threads(config, "generator", None, len(os.sched_getaffinity(0)))
        torch.set_num_threads(self.threads)
        self.config, self.generator_id, self.incarnation = config, generator_id, incarnation
        self.ctx = zmq.Context()
        # First, before the model loads: the supervisor hears this process from the start.
        self.heartbeat = HeartbeatThread(self.ctx, report_endpoint, generator_id, incarnation)
        self.tokenizer = load_tokenizer(Path(model_dir))
        compute = resolve_compute_dtype(config.model.compute_dtype, gen.device)
        log.info(
            "generator[%d]: %s",
            generator_id,
            describe_choice(config.model.compute_dtype, gen.device),
        )
        self.engine: Engine = make_engine(
            gen,
            Path(model_dir),
            seed=config.run.seed + generator_id,
            compute_dtype=compute,
            # The longest this generator asks for: a training call, an evaluation or an episode.
            max_model_len=config.data.max_prompt_tokens
            + max(
                gen.max_new_tokens,
                config.eval.max_new_tokens or 0,
                config.env.max_tokens if config.env.name else 0,
            ),
            bind_host=bind_host,  # the engine's own sockets (vLLM's process groups)
        )
        image = self.engine.shared_weights()
        if image is None:
            image = load_bf16_image(Path(model_dir))
        self._weight_endpoints = (publisher_endpoints, anchor_endpoints)
        self.weights_epoch = 0
        # The learner epoch of the weights the engine holds: behind ``weights_epoch`` from a
        # learner restart until the new group's anchors land (``streamrl.clock``).
        self.held_epoch = 0
        self.subscriber = self._subscribe(image)
        # Acknowledged delivery (buffers.delivery): groups are kept per shard until its receipt
        # comes back on an admission reply, and sent again if the shard is restarted.
        sender = new_sender()
        self.admission = AdmissionClient(
            self.ctx, admission_endpoint, generator_id, incarnation, sender
        )
        self.pushers, self.outboxes = [], []
        for shard_id, endpoint in enumerate(shard_endpoints):
            sock = make_socket(self.ctx, zmq.PUSH)
            sock.connect(endpoint)
            self.pushers.append(sock)
            self.outboxes.append(Outbox(shard_sender(sender, shard_id)))
        self._next_shard = itertools.cycle(range(len(self.pushers)))
        self.reporter = make_socket(self.ctx, zmq.PUSH)
        self.reporter.connect(report_endpoint)
        self.encoder = msgspec.msgpack.Encoder()
        self.prompts = PromptStream(config.data, config.run.seed)
        self.eval_set: list[Prompt] | None = None  # loaded when this generator is first asked
        self.reward = CombinedReward(config.rewards)
        self.episodes = EpisodeRunner(config, self.tokenizer) if config.env.name else None
        self.sampling = SamplingParams(
            temperature=gen.temperature,
            top_p=gen.top_p,
            top_k=gen.top_k,
            max_new_tokens=gen.max_new_tokens,
            stop_token_ids=stop_token_ids(self.tokenizer),
        )
        self.learner_version = 0
        # The newest (learner epoch, version) an evaluation was asked for and answered: a
        # restarted learner group's epoch repeats version numbers of weights that are gone.
        self.evaluated = (-1, -1)
        self.prompts_per_call = gen.prompts_per_call
        self.tokens_generated = self.groups_pushed = 0
        self._last_report = 0.0
        self.timers = GeneratorActivity()

    # ------------------------------------------------------------------ weights

    def _subscribe(self, image: dict[str, torch.Tensor], version: int = 0) -> WeightSubscriber:
        publishers, anchors = self._weight_endpoints
        return WeightSubscriber(
            image,
            publishers,
            anchors,
            self.generator_id,
            ctx=self.ctx,
            anchor_timeout_s=self.config.weights.anchor_timeout_s,
            version=version,
        )

    def _follow_restarted_learners(self, epoch: int) -> None:
        """The learner group restarted from a checkpoint: its versions go on from there, so the
        numbers this generator holds may name other weights. Start a fresh subscriber (same
        image, version -1: any version applies) and anchor every rank; decoding goes on with the
        weights held until the anchors land (``poll_weights``)."""
        log.info("generator[%d]: learners restarted (epoch %d)", self.generator_id, epoch)
        old = self.subscriber
        self.subscriber = self._subscribe(old.image, version=-1)
        old.close()
        self.weights_epoch = epoch
        if self.engine.version == 0:  # the base model: version 0 of every epoch
            self.held_epoch = epoch
        self._request_anchors()

    def _request_anchors(self) -> None:
        for rank in range(len(self.subscriber.ranks)):
            self.subscriber.request_anchor(rank)

    def poll_weights(self, _engine: Engine | None = None) -> None:
        start = time.perf_counter()
        changed = self.subscriber.poll(self.learner_version)
        # A version can move with no tensor changed (e.g. a zero-advantage step): still adopt
        # it; a repair anchor at the version held changes tensors without moving the version.
        # Version -1: a fresh subscriber after the learners restarted, anchors not in yet.
        moved = self.subscriber.version != self.engine.version or changed
        if self.subscriber.version >= 0:
            self.held_epoch = self.weights_epoch
        if self.subscriber.version >= 0 and moved:
            self.timers.weights_pause_s += time.perf_counter() - start  # decoding waited
            start = time.perf_counter()
            self.engine.update_weights(
                [(n, self.subscriber.image[n]) for n in changed], self.subscriber.version
            )
            self.timers.weights_pause_s += time.perf_counter() - start
            log.info("generator[%d]: applied version %d", self.generator_id, self.engine.version)
            self.report(force=True)

    def wait_for_version(
        self,
        version: int,
        stop_at: float = float("inf"),
        watch_stop: bool = False,
        epoch: int | None = None,
    ) -> bool:
        """Apply versions until ``version`` is held (of learner epoch ``epoch``, if given);
        False if ``stop_at`` passes first or, with ``watch_stop``, the run stops or the
        learners restart past ``epoch`` meanwhile (asked once a second: a stopped learner
        would never publish the version waited for, a restarted one may never reach it)."""

        def held() -> bool:
            same_epoch = epoch is None or self.held_epoch == epoch
            return same_epoch and self.engine.version >= version

        next_check = time.monotonic() + 1.0
        while not held() and time.monotonic() < stop_at:
            if epoch is not None and self.weights_epoch > epoch:
                return False  # those weights are gone
            self.poll_weights()
            self.subscriber.wait(0.01)
            if watch_stop and time.monotonic() > next_check:
                next_check = time.monotonic() + 1.0
                _, directives, clock, receipts = self.admission.request(0).parts()
                self.take_receipts(receipts)
                self.follow_clock(clock)
                if directives.stop:
                    return False
        return held()

    # ------------------------------------------------------------------ loop

    def run(self) -> dict[str, int]:
        """Ask for groups and handle the reply's parts until told to stop or retire."""
        # Again on this thread: a Ray actor runs its methods on other threads than __init__,
        # and where libgomp is preloaded OpenMP's thread count does not follow them there.
        torch.set_num_threads(self.threads)
        while True:
            with self._timing("wait_admission_s"):
                reply = self.admission.request(self.prompts_per_call)
            grant, directives, clock, receipts = reply.parts()
            self.follow_clock(clock)
            self.take_receipts(receipts)
            ending = self.obey(directives)
            if ending is None and not self.generate_granted(grant):
                ending = "stop"  # the run stopped while this generator waited for weights
            if ending is not None:
                return self.finish(drain=ending == "stop")

    def follow_clock(self, clock: LearnerClockInfo) -> None:
        """Keep up with the learner: anchor a fresh generator that is behind it (late join,
        resumed run), follow a learner restart, and note the version to drain to."""
        if self.learner_version == 0 and clock.learner_version > self.engine.version:
            self._request_anchors()
        if clock.weights_epoch > self.weights_epoch:
            self._follow_restarted_learners(clock.weights_epoch)
        self.learner_version = clock.learner_version

    def obey(self, directives: Directives) -> Ending | None:
        """Apply the live knobs and run an evaluation asked for; how the run ends, if it
        does."""
        self._apply_live_knobs(directives)
        if directives.retire:  # generator.count lowered: every granted group is pushed
            log.info("generator[%d]: retiring", self.generator_id)
            return "retire"
        if directives.stop:
            return "stop"
        asked = (directives.eval_epoch, directives.eval_version)
        if directives.eval_version >= 0 and asked > self.evaluated:
            with self._timing("eval_s"):
                self.evaluate(directives.eval_version, directives.eval_epoch)
        return None

    def generate_granted(self, grant: Grant) -> bool:
        """Wait for weights fresh enough, generate the granted prompts' groups and push them;
        with nothing granted, apply weights and report meanwhile. False if the run stopped
        while waiting for the weights."""
        if grant.granted == 0:
            with self._timing("wait_admission_s"):
                self.poll_weights()
                self.report()
                time.sleep(0.02)
            return True
        with self._timing("wait_weights_s"):
            held = self.wait_for_version(grant.min_version, watch_stop=True)
        if not held:
            return False
        with self._timing("busy_s"):
            groups = self.generate_groups([self.prompts[i] for i in grant.prompt_indices])
            for group, index in zip(groups, grant.prompt_indices, strict=True):
                group.prompt_index = index
            self.push(groups)
        self.timers.calls += 1
        # After every call: the controller's per-step figures count the groups just pushed.
        self.report(force=True)
        return True

    def finish(self, drain: bool) -> dict[str, int]:
        """Leave the run. ``drain`` (it stopped): first apply versions up to the learner's
        final one and evaluate those final weights (the evaluator only). Then wait for the
        shards' receipts of every group pushed."""
        if drain:
            self.wait_for_version(
                self.learner_version, time.monotonic() + self.config.run.drain_timeout_s
            )
            evaluator = self.generator_id == 0 and self.config.eval.every > 0
            held = (self.held_epoch, self.engine.version)
            if evaluator and held > self.evaluated:
                # The final weights: what the run produced.
                self.evaluate(self.engine.version, self.held_epoch, final=True)
        self.await_receipts()
        self.report(force=True)
        return {"version": self.engine.version, "groups": self.groups_pushed}

    @contextlib.contextmanager
    def _timing(self, activity: str) -> Iterator[None]:
        """Add the block's seconds to ``activity``'s timer, less the weight application inside
        it (``weights_pause_s`` has those)."""
        start, paused = time.perf_counter(), self.timers.weights_pause_s
        try:
            yield
        finally:
            spent = time.perf_counter() - start - (self.timers.weights_pause_s - paused)
            setattr(self.timers, activity, getattr(self.timers, activity) + spent)

    def evaluate(self, version: int, epoch: int, final: bool = False) -> None:
        """Held-out evaluation on weights >= ``version`` of learner epoch ``epoch``
        (``streamrl.evaluation``); its responses go to the controller as figures, never to
        the buffer. The first and the ``final`` one also ask the questions in a wording
        training never uses (``eval.unseen_phrasing``). Not run if those weights cannot come
        (the run stopped, or the learners restarted meanwhile: the controller asks again)."""
        from streamrl.evaluation import eval_prompts
        from streamrl.workers.evaluator import add_unseen_phrasing, evaluate

        if self.eval_set is None:
            self.eval_set = eval_prompts(self.config)
        stop_at = time.monotonic() + self.config.run.drain_timeout_s
        if not self.wait_for_version(version, stop_at, watch_stop=not final, epoch=epoch):
            log.warning(
                "generator[%d]: evaluation of version %d (epoch %d) abandoned: holding %d "
                "(epoch %d)",
                self.generator_id,
                version,
                epoch,
                self.engine.version,
                self.held_epoch,
            )
            return
        start = time.monotonic()
        result = evaluate(self.engine, self.tokenizer, self.config, self.eval_set)
        if final or self.evaluated[1] < 0:
            add_unseen_phrasing(result, self.engine, self.tokenizer, self.config)
        result.metrics["eval/seconds"] = time.monotonic() - start
        self.evaluated = (epoch, version)
        report = EvalReport(
            self.generator_id,
            version,
            result.version,
            result.metrics,
            time.time(),
            self.held_epoch,
        )
        self.reporter.send(self.encoder.encode(report))  # blocking: the controller waits for it
        log.info(
            "generator[%d]: evaluated version %d: %s",
            self.generator_id,
            result.version,
            result.metrics,
        )

    def _apply_live_knobs(self, directives: Directives) -> None:
        if directives.prompts_per_call is not None:
            self.prompts_per_call = directives.prompts_per_call
        temperature = directives.temperature
        if temperature is not None and temperature != self.sampling.temperature:
            self.sampling = dataclasses.replace(self.sampling, temperature=temperature)
            log.info("generator[%d]: temperature -> %s", self.generator_id, temperature)

    def generate_groups(self, prompts: list[Prompt]) -> list[TrajectoryGroup]:
        """One group per prompt of ``generator.group_size`` samples: a response each, or with
        an environment (``env.name``) an episode each (``workers.episodes``)."""
        size = self.config.generator.group_size
        on_step = self.poll_weights if self.config.generator.in_flight_updates else None
        # Tagged with the epoch the call starts on: tokens sampled after an in-flight switch
        # to a restarted group's weights count as the old epoch's (the shard may drop the
        # group: a regeneration, never a group trained on weights no learner has).
        created, epoch = time.time(), self.held_epoch
        if self.episodes is not None:
            trajectories = self._episode_trajectories(prompts, on_step)
        else:
            trajectories = self._response_trajectories(prompts, on_step)
        finished = time.time()
        return [
            TrajectoryGroup(
                group_id="",  # given with its delivery identity when pushed (``push``)
                prompt_id=prompt.prompt_id,
                trajectories=trajectories[i * size : (i + 1) * size],
                created_at=created,
                finished_at=finished,
                data_source=prompt.data_source,
                ground_truth=prompt.ground_truth,
                weights_epoch=epoch,
            )
            for i, prompt in enumerate(prompts)
        ]

    def _response_trajectories(
        self, prompts: list[Prompt], on_step: StepHook | None
    ) -> list[Trajectory]:
        """``group_size`` sampled responses of each prompt, scored by the job's rewards."""
        size = self.config.generator.group_size
        prompt_ids = [
            encode_prompt(self.tokenizer, p, self.config.data.max_prompt_tokens) for p in prompts
        ]
        batch = [ids for ids in prompt_ids for _ in range(size)]
        outputs = self.engine.generate(batch, self.sampling, on_step)
        prompt_bytes = [pack_int32(ids) for ids in prompt_ids]
        trajectories = []
        for row, out in enumerate(outputs):
            prompt = prompts[row // size]
            text = self.tokenizer.decode(out.response_ids, skip_special_tokens=True)
            reward = self.reward(RewardInput.of(prompt, text, out.response_ids, out.finish_reason))
            trajectories.append(
                Trajectory(
                    prompt_ids=prompt_bytes[row // size],
                    response_ids=pack_int32(out.response_ids),
                    behavior_logprobs=out.logprob_bytes(),
                    token_versions=pack_int32(out.token_versions),
                    reward=reward,
                    finish_reason=out.finish_reason,
                    generator_id=self.generator_id,
                    response_text=text,
                    temperature=self.sampling.temperature,
                )
            )
            self.tokens_generated += len(out.response_ids)
        return trajectories

    def _episode_trajectories(
        self, prompts: list[Prompt], on_step: StepHook | None
    ) -> list[Trajectory]:
        """``group_size`` episodes of each prompt with the environment, played to their ends:
        every turn's tokens with their mask, the environment's reward."""
        size = self.config.generator.group_size
        episodes = self.episodes.play(self.engine, prompts, size, self.sampling, on_step)
        self.tokens_generated += sum(sum(e.action_mask) for e in episodes)
        temperature = self.sampling.temperature
        return [self.episodes.trajectory(e, self.generator_id, temperature) for e in episodes]

    def push(self, groups: list[TrajectoryGroup]) -> None:
        """Send each group to the next shard, round-robin, with its delivery identity for that
        shard (``Outbox.address``), and keep its frame until the shard's receipt."""
        for group in groups:
            shard = next(self._next_shard)
            outbox = self.outboxes[shard]
            seq = outbox.address(group)
            frame = self.encoder.encode(group)
            self.pushers[shard].send(frame)
            outbox.keep(seq, frame)
            self.groups_pushed += 1

    def take_receipts(self, receipts: Receipts) -> None:
        """Forget the groups each shard acknowledged; send a restarted shard the rest again."""
        for shard, outbox in enumerate(self.outboxes):
            outbox.acknowledge(receipts.delivered.get(shard, -1))
            frames = outbox.resend_for(receipts.shard_epochs.get(shard, 0))
            if frames:
                log.info(
                    "generator[%d]: shard %d restarted; sending %d unacknowledged groups again",
                    self.generator_id,
                    shard,
                    len(frames),
                )
            for frame in frames:
                self.pushers[shard].send(frame)

    def await_receipts(self, timeout_s: float = RECEIPT_WAIT_S) -> int:
        """Before leaving: wait until the shards acknowledged every group pushed, sending a
        shard that restarted meanwhile its groups again (receipts come with admission
        replies, which grant a leaving generator nothing). Returns the groups still without a
        receipt after ``timeout_s`` (logged): the run's ``groups_lost_in_transit`` if their
        shard lost them."""
        deadline = time.monotonic() + timeout_s
        while any(box.unacked for box in self.outboxes):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(RECEIPT_POLL_S, left))
            try:
                reply = self.admission.request(0, timeout_s=max(left, 0.1))
                self.take_receipts(reply.parts().receipts)
            except TimeoutError:
                break  # the controller is gone: nobody to relay receipts
        unacked = sum(len(box.unacked) for box in self.outboxes)
        if unacked:
            log.warning(
                "generator[%d]: leaving with %d groups no shard acknowledged after %.0fs",
                self.generator_id,
                unacked,
                timeout_s,
            )
        return unacked

    def report(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_report < 1.0:
            return
        self._last_report = now
        sub = self.subscriber
        report = self.encoder.encode(
            GeneratorReport(
                generator_id=self.generator_id,
                applied_version=self.engine.version,
                tokens_generated=self.tokens_generated,
                groups_pushed=self.groups_pushed,
                checksum_failures=sub.checksum_failures,
                anchors_applied=sub.anchors_applied,
                time=time.time(),
                verified_versions=list(sub.verified_versions[-100:]),
                anchors_requested=sub.anchors_requested,
                weights_bytes_received=sub.bytes_received,
                weights_apply_s=sub.last_apply_s,
                weights_latency_s=sub.last_latency_s,
                images_verified=sub.images_verified,
                image_mismatches=sub.image_mismatches,
                reward_errors=self.reward.errors,
                weights_epoch=self.held_epoch,
                activity=msgspec.structs.replace(self.timers),  # a copy: the timers go on
                incarnation=self.incarnation,
                episode_ends=dict(self.episodes.ends) if self.episodes else {},
                episode_errors=dict(self.episodes.errors) if self.episodes else {},
            )
        )
        try:
            self.reporter.send(report, zmq.NOBLOCK)
        except zmq.Again:  # the controller is behind: the next report carries the totals
            pass

    def close(self) -> None:
        if self.episodes is not None:
            self.episodes.close()
        self.heartbeat.stop()
        self.subscriber.close()
        self.engine.shutdown()
        self.ctx.destroy(linger=0)
