"""Held-out evaluation where there is slack: a process of its own beside generator 0
(``eval.runs_on``, docs/design.md §5).

Evaluating in the pacing generator's loop stops sampling for as long as it takes (37 s of a
514 s default job on an AMX Xeon). This process holds its own engine and follows the weight
stream itself (a subscriber of its own, applying inline), so the generator only forwards the
controller's requests and the results. It works only while generator 0 does not generate:
generator 0 opens a gate (``SlackEvaluator.open``) while it waits for admission or weights and
closes it when it samples, and the process waits at the gate between decode steps (receiving
the weight stream meanwhile, applying nothing). Running beside the generator instead, even at
the lowest CPU priority, slowed the default job by 15% on a 2-core EPYC (decoding is bound by
memory bandwidth: a second decoder on the idle core slows the first). It also runs under
``SCHED_IDLE`` on every core of the run, so it never takes a core another role wants. At the
end of the run (the gate open, everything else idle) it has the machine to itself.

Pipe messages are msgspec Structs, one tagged union per direction, msgpack-encoded (no
pickle on the pipe): generator -> process ``ToProcess`` (``ClockNews``, ``EvalAsk``,
``Close``), process -> generator ``FromProcess`` (``Ready``, ``Evaluated``, ``Abandoned``).
The process ends with its generator: an end of the pipe, or the parent's death (Linux's
parent-death signal), ends it.

Example: generator 0 told to evaluate v10 sends ``EvalAsk(10, 0, final=False, unseen=False)``
and goes on sampling; the process applies versions up to 10 from its own subscriber,
evaluates, and sends ``Evaluated(10, 0, result, held_epoch=0)``, which generator 0 forwards
to the controller as an ``EvalReport`` (``workers.generation.generator_evaluations``).
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import signal
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import msgspec

from streamrl.evaluation import EvalResult
from streamrl.malloc import SlowCollections, defer_collections, freeze_startup_heap
from streamrl.protocol import GeneratorActivity, LearnerClockInfo
from streamrl.role_specs import GeneratorSpec

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
# Subscriber ids of evaluation processes sit above any generator id (anchor requests name
# their subscriber in the learners' logs).
EVAL_SUBSCRIBER_BASE = 1_000_000


class ClockNews(msgspec.Struct, tag="clock"):
    """The learner clock as generator 0 last heard it (sent when it changes)."""

    clock: LearnerClockInfo


class EvalAsk(msgspec.Struct, tag="eval", frozen=True):
    """Evaluate ``version`` of learner epoch ``epoch``; ``unseen``: also in the wording
    training never uses. Asked twice while waiting: answered once."""

    version: int
    epoch: int
    final: bool
    unseen: bool


class Close(msgspec.Struct, tag="close"):
    """Generator 0 is leaving: the process ends."""


class Ready(msgspec.Struct, tag="ready"):
    """The process loaded its engine and the held-out set."""


class Evaluated(msgspec.Struct, tag="result"):
    """The answer to ``EvalAsk(version, epoch)``; ``held_epoch``: the epoch of the weights
    evaluated."""

    version: int
    epoch: int
    result: EvalResult
    held_epoch: int


class Abandoned(msgspec.Struct, tag="abandoned"):
    """``EvalAsk(version, epoch)`` cannot be answered: that epoch's weights are gone (the
    learner group restarted); the controller asks again."""

    version: int
    epoch: int


ToProcess = ClockNews | EvalAsk | Close
FromProcess = Ready | Evaluated | Abandoned


def _idle_priority(cores: list[int] | None) -> str:
    """Lowest priority on every core of the run; says what it got."""
    if cores:
        os.sched_setaffinity(0, cores)
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        return "SCHED_IDLE"
    except (AttributeError, OSError):  # not Linux, or refused: the lowest nice value
        os.nice(19)
        return "nice 19"


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:  # not glibc: the pipe's end still ends the process
        pass


def hold_at(asked: list[EvalAsk], answered: int, every: int) -> int:
    """The newest version the process's engine may take: the oldest asked, else the next one
    the schedule will ask for after ``answered`` (an ask comes only after the learner
    published its version). Counted from the last answer, not from the engine's version: the
    engine reaches that next version before its ask arrives, and a hold counted from there
    moved on to the one after, so the ask for v20 was answered with v25's weights, v25's with
    v35's (a distillation run on an EPYC, 2026-12-04)."""
    if asked:
        return asked[0].version
    return (answered // every + 1) * every


class LastFigures:
    """The figures of the weights evaluated last, for an ask those same weights answer again.

    Why: a process starved of cores falls behind the stream and can no longer hold an old
    ask's version; it then answers each waiting ask with the newest weights it has. A
    distillation run on a 2-core AVX2 EPYC (2026-12-07) had its v5-v35 asks all answered with
    v40's weights at the end of the run, six passes of 13 s over the held-out set for one
    set of figures. An ask whose answer would be the same weights (engine version and
    learner epoch) gets the figures again, each reported with the version they are of; an
    ask for the unseen wording is evaluated unless the last pass asked it too."""

    def __init__(self) -> None:
        self._key: tuple[int, int] | None = None
        self._unseen = False
        self._result: EvalResult | None = None

    def get(self, version: int, epoch: int, unseen: bool) -> EvalResult | None:
        """The last figures if they are of weights ``version`` of ``epoch`` and cover
        ``unseen``; else None (evaluate)."""
        if self._key != (version, epoch) or (unseen and not self._unseen):
            return None
        return self._result

    def put(self, version: int, epoch: int, unseen: bool, result: EvalResult) -> None:
        self._key, self._unseen, self._result = (version, epoch), unseen, result


def serve(spec: GeneratorSpec, conn: Connection, gate: Any) -> None:
    """The process's main: build the engine and a subscriber, then follow the stream and
    answer evaluation requests until the pipe closes."""
    _die_with_parent()
    SlowCollections().install()
    if spec.log_file:
        logging.basicConfig(
            filename=spec.log_file,
            level=logging.INFO,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
    policy = _idle_priority(spec.slack_cores)
    defer_collections()  # until it is ready (freeze_startup_heap)
    import torch
    import zmq

    from streamrl.callables import install as install_callables
    from streamrl.evaluation import eval_prompts
    from streamrl.models import load_tokenizer
    from streamrl.transport import resolve_host
    from streamrl.workers.engines import build_engine
    from streamrl.workers.generation.evaluator import evaluate_held_out
    from streamrl.workers.generation.generator_weights import GeneratorWeights

    # One thread: a second one of an OpenMP team under SCHED_IDLE would spin at each barrier
    # while the kernel holds its partner back.
    torch.set_num_threads(1)
    install_callables(spec.callables)
    config = spec.config
    model_dir = Path(spec.model_dir)
    tokenizer = load_tokenizer(model_dir)
    engine = build_engine(config, model_dir, spec.generator_id, resolve_host(spec.bind_host))
    ctx = zmq.Context()
    sub_spec = msgspec.structs.replace(spec, generator_id=EVAL_SUBSCRIBER_BASE + spec.generator_id)
    # Its own copy of the weights moves only when an evaluation asks, on its one core: on
    # this thread between evaluations, not on a weight thread beside an engine.
    weights = GeneratorWeights(
        ctx, engine, sub_spec, GeneratorActivity(), lambda: None, background=False
    )
    eval_set = eval_prompts(config)
    freeze_startup_heap()  # no full collection over the engine's objects (streamrl.malloc)
    log.info("evaluation process %d ready (%s, cores %s)", os.getpid(), policy, spec.slack_cores)
    encoder, decoder = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(ToProcess)

    def send(message: FromProcess) -> None:
        conn.send_bytes(encoder.encode(message))

    send(Ready())
    asked: list[EvalAsk] = []  # in the order asked: each is answered, none skipped
    answered = -1  # the version of the last evaluation sent back
    every = max(config.eval.every, 1)
    last = LastFigures()

    def wait_for_slack(_engine: object = None) -> None:
        """While generator 0 samples: receive the weight stream, apply nothing."""
        while not gate.is_set():
            weights.receive_only()
            gate.wait(0.05)

    try:
        while True:
            wait_for_slack()
            while conn.poll(0):
                match decoder.decode(conn.recv_bytes()):
                    case Close():
                        return
                    case ClockNews(clock=clock):
                        weights.follow_clock(clock)
                        # A learner restart forked the clock back: the schedule asks again
                        # from there (in one epoch the clock is never behind an answer).
                        answered = min(answered, clock.learner_version)
                    case EvalAsk() as ask if ask not in asked:  # asked again: answered once
                        asked.append(ask)
            # The engine takes only the next evaluation's weights; the image follows the
            # stream up to them.
            weights.up_to = hold_at(asked, answered, every)
            weights.poll()
            if asked:
                ask = asked[0]
                if ask.epoch < weights.weights_epoch:  # those weights are gone
                    send(Abandoned(ask.version, ask.epoch))
                    asked.pop(0)
                    continue
                if weights.held_epoch == ask.epoch and engine.version >= ask.version:
                    held = (engine.version, weights.held_epoch, ask.unseen)
                    result = last.get(*held)
                    if result is None:
                        result = evaluate_held_out(
                            engine, tokenizer, config, eval_set, ask.unseen, wait_for_slack
                        )
                        last.put(*held, result)
                    else:
                        log.info("v%d asked: v%d's figures again", ask.version, engine.version)
                    send(Evaluated(ask.version, ask.epoch, result, weights.held_epoch))
                    answered = ask.version
                    asked.pop(0)
                    continue
            weights.subscriber.wait(0.05)
    except (EOFError, BrokenPipeError):  # the generator is gone
        return
    finally:
        weights.close()
        engine.shutdown()
        ctx.destroy(linger=0)


class SlackEvaluator:
    """Generator 0's handle on its evaluation process (module doc): an ``EvalProcess``
    (``workers.generation.generator_evaluations``) whose asks go to the process."""

    in_process = True  # evaluations run out of generator 0's loop

    def __init__(self, spec: GeneratorSpec) -> None:
        mp = multiprocessing.get_context("spawn")  # a fresh interpreter: no forked threads
        self._conn, child = mp.Pipe()
        self.gate = mp.Event()  # set: generator 0 is not sampling, the process may work
        self.gate.set()
        log_file = spec.log_file.replace(".log", "-eval.log") if spec.log_file else ""
        child_spec = msgspec.structs.replace(spec, log_file=log_file)
        self.process = mp.Process(target=serve, args=(child_spec, child, self.gate), daemon=True)
        self.process.start()
        child.close()
        self.ready = False
        self._clock: LearnerClockInfo | None = None
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(FromProcess)
        log.info("generator[%d]: evaluation process %d", spec.generator_id, self.process.pid)

    def alive(self) -> bool:
        return self.process.is_alive()

    def exited(self) -> bool:
        """The process is gone (it crashed or was killed): generator 0 evaluates inline."""
        return not self.process.is_alive()

    @property
    def exitcode(self) -> int | None:
        return self.process.exitcode

    def open(self) -> None:
        """Generator 0 stopped sampling (it waits, or the run ends): the process may work."""
        self.gate.set()

    def shut(self) -> None:
        """Generator 0 samples: the process waits at its next decode step."""
        self.gate.clear()

    def follow_clock(self, clock: LearnerClockInfo) -> None:
        if clock != self._clock and self.alive():
            self._clock = clock
            self._send(ClockNews(clock))

    def ask(self, version: int, epoch: int, final: bool, unseen: bool) -> bool:
        """Ask for an evaluation (after those asked before); False if the process is gone."""
        return self._send(EvalAsk(version, epoch, final, unseen))

    def take(self, timeout_s: float = 0.0) -> list[Evaluated | Abandoned]:
        """The answers waiting (after up to ``timeout_s`` for the first)."""
        out: list[Evaluated | Abandoned] = []
        try:
            if not self._conn.poll(timeout_s):
                return out
            while self._conn.poll(0):
                message = self._decoder.decode(self._conn.recv_bytes())
                if isinstance(message, Ready):
                    self.ready = True
                else:
                    out.append(message)
        except (EOFError, OSError):
            pass  # the process died: exited() says so
        return out

    def _send(self, message: ToProcess) -> bool:
        try:
            self._conn.send_bytes(self._encoder.encode(message))
            return True
        except (BrokenPipeError, OSError):
            return False

    def close(self, timeout_s: float = 10.0) -> None:
        self.gate.set()
        self._send(Close())
        self.process.join(timeout_s)
        if self.process.is_alive():
            self.process.kill()  # by its pid: ours
            self.process.join(5)
        self._conn.close()
