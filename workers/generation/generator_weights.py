"""The generator's weights: which learner version and epoch its engine holds, and moving it on.

One owner for the generator's side of the learner clock (``streamrl.clock``, docs/design.md §3
and §4): ``learner_version`` (the newest version the controller says the learners have),
``weights_epoch`` (the learner group's epoch, from the same reply) and ``held_epoch`` (the
epoch of the weights the engine holds: behind ``weights_epoch`` from a learner restart until
the new group's anchors land). The subscriber (``workers.generation.subscriber``) assembles
versions;
``poll`` hands each new one to the engine, between decode steps when in-flight updates are on.

Off the decode path (``background``, docs/design.md §4): a weight thread
owns the subscriber. It receives, decodes and verifies each version into its own image, and
has the engine prepare it (``Engine.prepare_weights``: for the HF engine new tensors and
their packed copies); ``poll`` on the generator's thread only adopts what is prepared, a swap
of tensors. The thread moves the image on only once the prepared version is adopted, so a
prepared update may read the image until then. Other threads touch the subscriber (anchors, a
learner restart) under ``_lock``.

The hand-off is one slot under one condition (``_handoff``): the weight thread fills it and
then waits while it is full; ``poll`` adopts and empties it under the same condition, so
neither can see the other half-done (the thread cannot park with the slot empty, the
generator cannot adopt a version twice). Example: the thread fills v5 and waits; ``poll``
adopts v5, empties the slot and notifies; the thread wakes and prepares v6.

Example: holding v4 of epoch 0, the learners restart from their v3 checkpoint (epoch 1):
``follow_clock`` starts a fresh subscriber at version -1 and anchors every rank; decoding goes
on with v4 of epoch 0 until the anchors land, then ``held_epoch`` becomes 1. A wait for
``(epoch 0, v5)`` gives up: those weights will never come.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import torch
import zmq

from streamrl.cores import burst_pool, side_thread
from streamrl.models import load_bf16_image
from streamrl.models.lora import LoraMerge, adapter_settings, is_base, load_adapter_image
from streamrl.protocol import GeneratorActivity, LearnerClockInfo, WeightStages
from streamrl.role_specs import GeneratorSpec
from streamrl.workers.engines import Engine
from streamrl.workers.generation.engine_copy import EngineCopy
from streamrl.workers.generation.subscriber import WeightSubscriber
from streamrl.workers.progress import Progress

log = logging.getLogger(__name__)


@dataclass
class _Prepared:
    """A version the weight thread made ready: ``adopt`` gives it to the engine."""

    version: int
    epoch: int  # the learner epoch of the subscriber that assembled it
    adopt: Callable[[], None]
    published_at: float  # wall time the learner published it (``time.time()`` if unknown)
    stages: WeightStages  # up to its preparation (``adopt_s`` is filled at adoption)
    prepared_at: float  # wall time


@dataclass
class _PreparedAhead:
    """What the engine prepared of a version while its chunks arrived (``_prepare_ahead``):
    the tensors, and their adoptions, made with the rest's once the version is whole."""

    subscriber: WeightSubscriber  # whose version it is (a learner restart brings a new one)
    version: int
    names: set[str] = field(default_factory=set)
    adopts: list[Callable[[], None]] = field(default_factory=list)
    seconds: float = 0.0


def _in_turn(adopts: list[Callable[[], None]]) -> Callable[[], None]:
    def adopt() -> None:
        for one in adopts:
            one()

    return adopt


class GeneratorWeights:
    """The subscriber, the learner clock as this generator knows it, and the engine's
    version. ``timers.weights_pause_s`` counts the time decoding waited for weights;
    ``on_applied`` runs after each version the engine takes (a forced report)."""

    def __init__(
        self,
        ctx: zmq.Context,
        engine: Engine,
        spec: GeneratorSpec,
        timers: GeneratorActivity,
        on_applied: Callable[[], None],
        progress: Progress | None = None,
        background: bool = True,
        own_image: bool = False,
    ) -> None:
        self.ctx, self.engine, self.generator_id = ctx, engine, spec.generator_id
        # Each version adopted is a step; a wait for a version the learner has published is
        # work (a hand-off that never comes is then a stall the supervisor sees).
        self.progress = progress if progress is not None else Progress()
        self._endpoints = (spec.publisher_endpoints, spec.anchor_endpoints)  # one per rank
        self._anchor_timeout_s = spec.config.weights.anchor_timeout_s
        self.timers, self.on_applied = timers, on_applied
        self.background = background
        self.learner_version = 0
        self.weights_epoch = 0
        # The evaluation process's target: the subscriber goes no further than this, and the
        # engine takes no version short of it (the image moves through the versions between,
        # their changed names kept in ``_unprepared``: an engine update is a repack of
        # every changed linear for the HF engine, worth doing only for a version evaluated).
        # None: follow the stream.
        self.up_to: int | None = None
        self._unprepared: set[str] = set()
        # The learner epoch of the weights the engine holds: behind ``weights_epoch`` from a
        # learner restart until the new group's anchors land (``streamrl.clock``).
        self.held_epoch = 0
        # With LoRA the stream carries adapters only: the image is theirs, and each version
        # reaches the engine as merged weights (``streamrl.models.lora.LoraMerge``).
        self.lora: LoraMerge | None = None
        # Whether no forward reads the image between polls, so the subscriber may write a
        # version's chunks as they arrive (``WeightSubscriber.write_ahead``): the weight
        # thread's image (the parameters it writes in place are prepacked weights, read only
        # by ``prepare_weights`` on that thread), or one the engine does not share.
        private = self.background
        if spec.adapter_dir:
            image = load_adapter_image(Path(spec.adapter_dir))
            private = True
            settings = adapter_settings(spec.config)
            self.lora = LoraMerge(Path(spec.model_dir), image, settings)
            if not is_base(image):  # a given adapter: version 0 is base + adapter
                engine.update_weights(self.lora.merged(image), engine.version)
        else:
            # An engine that shares its parameters is written in place; else a bf16 image.
            # ``own_image``: never in place, so the engine's weights change only when it takes
            # a version (a lagged teacher scores between polls, at versions it chose).
            image = None if own_image else engine.shared_weights()
            if image is None:
                image = load_bf16_image(Path(spec.model_dir))
                private = True
            elif self.background:
                # The thread writes the image while the engine decodes: its own copy of the
                # tensors a forward reads; the others it writes in place.
                live = engine.live_weight_names()
                image = {n: t.clone() if n in live else t for n, t in image.items()}
        # An engine with its own copy takes each tensor's changed elements once it has the
        # tensor whole (LoRA's merged weights are not the image: whole each time).
        self._copy = EngineCopy(engine.takes_positions and self.lora is None)
        # A version's blocks are applied, and its packed copies made, on every core the
        # weight thread may use (streamrl.cores.burst_pool).
        self._pool = burst_pool(spec.slack_cores, f"weights-{self.generator_id}")
        self._write_ahead = private
        # Prepared as it arrives, a group of tensors at a time (``Engine.weight_groups``): on
        # the weight thread, for an engine that prepares in groups; not for LoRA, whose
        # merged layers are made from the whole version's adapters.
        groups = engine.weight_groups() if self.background and self.lora is None else None
        self._groups = groups
        self._ahead: _PreparedAhead | None = None
        self.tensors_prepared_ahead = 0  # over the run, a figure for tests and logs
        self.subscriber = self._subscribe(image)
        self.subscriber_epoch = 0  # the learner epoch the subscriber's versions belong to
        self.last_latency_s = 0.0  # publish -> adopted by the engine, the newest version
        self.last_stages = WeightStages()  # the same, stage by stage
        self._lock = threading.Lock()  # the subscriber, between the weight thread and others
        # The hand-off slot (module doc): a prepared version waiting for adoption, or None.
        # Written and emptied only under ``_handoff``.
        self._handoff = threading.Condition()
        self._prepared: _Prepared | None = None
        self._stop = threading.Event()
        self._failure: BaseException | None = None
        self._thread: threading.Thread | None = None
        if self.background:
            self._thread = threading.Thread(
                target=self._weight_thread,
                args=(spec.slack_cores,),
                name=f"weights-{self.generator_id}",
                daemon=True,
            )
            self._thread.start()

    def _subscribe(self, image: dict[str, torch.Tensor], version: int = 0) -> WeightSubscriber:
        publishers, anchors = self._endpoints
        return WeightSubscriber(
            image,
            publishers,
            anchors,
            self.generator_id,
            ctx=self.ctx,
            anchor_timeout_s=self._anchor_timeout_s,
            version=version,
            pool=self._pool,
            write_ahead=self._write_ahead,
        )

    def follow_clock(self, clock: LearnerClockInfo) -> None:
        """Keep up with the learner: anchor a fresh generator that is behind it (late join,
        resumed run), follow a learner restart, and note the version to drain to."""
        if self.learner_version == 0 and clock.learner_version > self.engine.version:
            self.request_anchors()
        if clock.weights_epoch > self.weights_epoch:
            self._follow_restarted_learners(clock.weights_epoch)
        self.learner_version = clock.learner_version

    def _follow_restarted_learners(self, epoch: int) -> None:
        """The learner group restarted from a checkpoint: its versions go on from there, so the
        numbers this generator holds may name other weights. Start a fresh subscriber (same
        image, version -1: any version applies) and anchor every rank; decoding goes on with the
        weights held until the anchors land (``poll``)."""
        log.info("generator[%d]: learners restarted (epoch %d)", self.generator_id, epoch)
        with self._lock:
            old = self.subscriber
            self.subscriber = self._subscribe(old.image, version=-1)
            self.subscriber_epoch = epoch
            old.close()
        self.weights_epoch = epoch
        if self.engine.version == 0:  # the base model: version 0 of every epoch
            self.held_epoch = epoch
        self.request_anchors()

    def request_anchors(self) -> None:
        with self._lock:
            for rank in range(len(self.subscriber.ranks)):
                self.subscriber.request_anchor(rank)

    def poll(self, _engine: Engine | None = None) -> None:
        """Give the engine the newest version ready (an engine's step hook): in the
        background, adopt what the weight thread prepared; else receive and apply here."""
        start = time.perf_counter()
        if self._failure is not None:
            raise RuntimeError(f"generator[{self.generator_id}]: the weight thread failed") from (
                self._failure
            )
        if not self.background:
            self._advance()
        with self._handoff:
            prepared = self._prepared
            if prepared is not None:
                prepared.adopt()  # the thread waits meanwhile: the update may read the image
                self._prepared = None
                self._handoff.notify_all()
        if prepared is None:
            # A version -1 subscriber (learners restarted) holds the engine's weights once its
            # anchors land at the version the engine holds: nothing to adopt, the epoch moves.
            if self.subscriber.version == self.engine.version >= 0:
                self.held_epoch = self.subscriber_epoch
            return
        self.held_epoch = prepared.epoch
        self.progress.tick()
        self.timers.weights_pause_s += time.perf_counter() - start  # decoding waited this long
        now = time.time()
        self.last_latency_s = max(0.0, now - prepared.published_at)
        self.last_stages = msgspec.structs.replace(
            prepared.stages, adopt_s=max(0.0, now - prepared.prepared_at)
        )
        log.info("generator[%d]: applied version %d", self.generator_id, self.engine.version)
        self.on_applied()

    def _advance(self) -> bool:
        """Move the subscriber to the newest version every rank can reach and have the engine
        prepare it; True if a version was prepared. (The weight thread, or ``poll`` inline.)"""
        with self._lock:
            sub = self.subscriber
            start = time.perf_counter()
            changed = sub.poll(self.learner_version, self.up_to)
            if self.up_to is not None and 0 <= sub.version < self.up_to:
                self._unprepared.update(changed)  # the image moved; the engine waits
                return False
            unprepared = self._unprepared  # moved through versions whose records are gone
            if unprepared:
                changed = sorted(unprepared.union(changed))
                self._unprepared = set()
            # A version can move with no tensor changed (e.g. a zero-advantage step): still
            # adopt it; a repair anchor at the version held changes tensors without moving the
            # version. Version -1: a fresh subscriber after the learners restarted, anchors
            # not in yet.
            moved = sub.version != self.engine.version or changed
            if sub.version < 0 or not moved:
                self._prepare_ahead(sub)
                return False
            # What was prepared while the version arrived counts if the version taken is the
            # one written ahead, and nothing after it.
            ahead, self._ahead = self._ahead, None
            if ahead is not None and not (
                ahead.subscriber is sub and ahead.version == sub.version and sub.took_ahead
            ):
                ahead = None
            done = ahead.names if ahead is not None else set()
            if self.lora is not None:
                named = self.lora.merged(sub.image, changed)
            else:
                named = [(n, sub.image[n]) for n in changed if n not in done]
            received = time.perf_counter()
            names = [n for n, _ in named]
            positions = self._copy.positions(sub.last_records, names, exclude=unprepared)
            adopt = self.engine.prepare_weights(
                named, sub.version, pool=self._pool, positions=positions
            )
            adopt = _in_turn(
                [*(ahead.adopts if ahead is not None else []), adopt, self._copy.on_adopt(names)]
            )
            prepare_s = time.perf_counter() - received
            log.info(
                "generator[%d]: version %d applied to the image in %.3f s, prepared in %.3f s "
                "(%d of %d tensors ahead, in %.3f s)",
                self.generator_id,
                sub.version,
                received - start,
                prepare_s,
                len(done),
                len(changed),
                ahead.seconds if ahead is not None else 0.0,
            )
            published_at = time.time()  # an anchor: no publish time to measure from
            stages = WeightStages(version=sub.version, prepare_s=prepare_s)
            if sub.history and sub.history[-1][0] == sub.version:
                _, applied_at, _, latency = sub.history[-1]
                published_at = applied_at - latency
                stages = msgspec.structs.replace(sub.last_stages, prepare_s=prepare_s)
            with self._handoff:
                self._prepared = _Prepared(
                    sub.version,
                    self.subscriber_epoch,
                    adopt,
                    published_at,
                    stages,
                    prepared_at=time.time(),
                )
                self._handoff.notify_all()
        return True

    def _prepare_ahead(self, sub: WeightSubscriber) -> None:
        """While a version arrives (written ahead): have the engine prepare each group of its
        tensors that no part still to come can change (``WeightSubscriber.ahead_final``), so
        that once the version is whole only the rest is left to prepare."""
        found = sub.ahead_final() if self._groups is not None else None
        if found is None:
            return
        version, final, changed = found
        ahead = self._ahead
        if ahead is None or ahead.subscriber is not sub or ahead.version != version:
            ahead = self._ahead = _PreparedAhead(sub, version)
        ready = {n for group in self._groups if group <= final for n in group & changed}
        ready -= ahead.names
        if not ready:
            return
        start = time.perf_counter()
        named = [(n, sub.image[n]) for n in sorted(ready)]
        positions = self._copy.positions(sub.ahead_records(), ready, exclude=self._unprepared)
        adopt = self.engine.prepare_weights(named, version, pool=self._pool, positions=positions)
        ahead.adopts += [adopt, self._copy.on_adopt(ready)]
        ahead.names |= ready
        ahead.seconds += time.perf_counter() - start
        self.tensors_prepared_ahead += len(ready)

    def receive_only(self) -> None:
        """Drain the sockets without moving the version the subscriber holds (the evaluation
        process while generator 0 samples: diffs wait as received, nothing is decoded)."""
        with self._lock:
            sub = self.subscriber
            self._unprepared.update(sub.poll(self.learner_version, max(sub.version, 0)))

    def _weight_thread(self, cores: list[int] | None) -> None:
        """Receive and prepare versions until closed; waits while one is prepared and not
        adopted (the prepared update may read the image). On the run's cores when given:
        where the generator's core is busy decoding, the work goes to one with slack."""
        side_thread()  # ahead of the decode on a core both want (streamrl.cores)
        if cores:
            os.sched_setaffinity(0, cores)  # this thread only (Linux affinity is per thread)
            log.info("generator[%d]: weight thread on cores %s", self.generator_id, cores)
        try:
            # Here, not at import: numba loads where versions are applied (diff_kernels), and
            # the first one does not wait for its compile.
            from streamrl.workers.diff_kernels import compile_kernels

            compile_kernels(encode=False)
            while not self._stop.is_set():
                with self._handoff:
                    if self._prepared is not None:  # adopted at the next decode step
                        self._handoff.wait(0.05)
                        continue
                if not self._advance():
                    with self._lock:
                        self.subscriber.wait(0.02)
        except BaseException as exc:  # the generator raises it at its next poll
            log.exception("generator[%d]: weight thread failed", self.generator_id)
            self._failure = exc

    def wait_for_version(
        self,
        version: int,
        stop_at: float = float("inf"),
        run_goes_on: Callable[[], bool] | None = None,
        epoch: int | None = None,
        meanwhile: Callable[[], None] | None = None,
    ) -> bool:
        """Apply versions until ``version`` is held (of learner epoch ``epoch``, if given);
        False if ``stop_at`` passes first, the learners restart past ``epoch`` meanwhile, or
        ``run_goes_on`` (asked once a second, if given) says the run stopped: a stopped
        learner would never publish the version waited for, a restarted one may never reach
        it. ``meanwhile`` runs on every turn of the wait (the generator's scoring replies)."""

        def held() -> bool:
            same_epoch = epoch is None or self.held_epoch == epoch
            return same_epoch and self.engine.version >= version

        next_check = time.monotonic() + 1.0
        with contextlib.ExitStack() as work:
            working = False
            while not held() and time.monotonic() < stop_at:
                if epoch is not None and self.weights_epoch > epoch:
                    return False  # those weights are gone
                if not working and version <= self.learner_version:
                    work.enter_context(self.progress.working())  # it is published: work
                    working = True
                self._wait_turn(meanwhile)
                if run_goes_on is not None and time.monotonic() > next_check:
                    next_check = time.monotonic() + 1.0
                    if not run_goes_on():
                        return False
        return held()

    def wait_for_grant(
        self,
        min_version: int,
        run_goes_on: Callable[[], bool],
        meanwhile: Callable[[], None] | None = None,
    ) -> bool:
        """Wait for the weights a grant names: ``min_version`` of the learner epoch it was
        granted in. If the learners restart meanwhile, their new epoch may resume from a
        checkpoint behind ``min_version`` and would reach it only by training on groups this
        generator has not made yet (with one generator, never): so the wait moves to the new
        epoch's newest published version instead. False only if the run stopped.

        Example: granted at v7 of epoch 0 while v7 is being published; a rank dies and the
        group resumes at its v4 checkpoint (epoch 1): the grant is sampled on epoch 1's v4."""
        epoch = self.weights_epoch
        while not self.wait_for_version(
            min_version, run_goes_on=run_goes_on, epoch=epoch, meanwhile=meanwhile
        ):
            if self.weights_epoch == epoch:
                return False  # the run stopped
            newest = min(min_version, self.learner_version)
            log.info(
                "generator[%d]: learners restarted while waiting for v%d of epoch %d; "
                "waiting for v%d of epoch %d instead",
                self.generator_id,
                min_version,
                epoch,
                newest,
                self.weights_epoch,
            )
            epoch, min_version = self.weights_epoch, newest
        return True

    def _wait_turn(self, meanwhile: Callable[[], None] | None) -> None:
        """One turn of ``wait_for_version``: adopt what is ready, wait a moment for more."""
        self.poll()
        if self.background:
            with self._handoff:  # woken when the thread fills the slot
                if self._prepared is None:
                    self._handoff.wait(0.01)
        else:
            self.subscriber.wait(0.01)
        if meanwhile is not None:
            meanwhile()

    def close(self) -> None:
        self._stop.set()
        with self._handoff:
            self._handoff.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._lock:
            self.subscriber.close()
        if self._pool is not None:
            self._pool.shutdown(wait=False)
