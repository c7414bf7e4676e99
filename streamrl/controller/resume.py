"""``--resume``: a run goes on from its newest checkpoint (docs/design.md §3).

Two moments of the controller's ``_start``: before the learner group starts, the run's weight
clock forks (``fork_clock``: a new epoch, forked at the checkpoint's version, so the shards
drop every logged group sampled from weights after it); once the learners have loaded the
checkpoint, the shards hear that epoch and the admission budget and the prompt stream are
restored (``restore``).

Example: a run checkpointed at v40 that died at v47 resumes in epoch 1 forked at 40: the
groups its shards logged from v41-v47 are dropped as ``dead_timeline``, the budget counts the
batches of v1-v40 as spent, and the prompt stream continues after the last prompt v40 took.
"""

from __future__ import annotations

from pathlib import Path

from streamrl import checkpoint_layout
from streamrl.controller.context import RunContext
from streamrl.controller.recovery import announce_epoch
from streamrl.controller.rundir import resume_clock
from streamrl.controller.state import load_prompt_ledger, shard_drops


def fork_clock(ctx: RunContext) -> Path | None:
    """Move the run's state to the resumed epoch and its forks; returns the checkpoint the
    learners will load (None: there is none, and the run starts over in a new epoch)."""
    checkpoint = checkpoint_layout.latest(ctx.run_dir / "checkpoints")
    # An unclean end may have logged weights after the checkpoint: they are off the timeline.
    version, extra = checkpoint_layout.read_meta(checkpoint) if checkpoint else (0, {})
    epoch, forks = resume_clock(ctx.run_dir, version if checkpoint else None, extra)
    ctx.state.weights_epoch, ctx.state.forks = epoch, forks
    return checkpoint


def restore(ctx: RunContext, version: int, from_checkpoint: bool) -> None:
    """The shards hear the new epoch first (they drop the dead tail and cancel nothing: no
    learner of the old run is alive), then the budget of the batches already trained on is
    spent, and the prompt stream continues where the checkpointed model left off
    (prompts.json, plus what the old epoch's take receipts name for steps after it). Without
    a checkpoint the stream starts over."""
    cfg, state = ctx.config, ctx.state
    state.version = version
    ctx.refresh_shard_stats()
    dead_before = dead_timeline(ctx)  # the logs count every process's drops
    announce_epoch(ctx, state.weights_epoch, version, state.forks)
    ctx.refresh_shard_stats()
    state.restore_admission(version, cfg.learner.groups_per_step, cfg.buffer.max_reuse)
    if from_checkpoint:
        receipts = state.receipts_after(state.weights_epoch - 1, version)
        lost = [i for r in receipts for i in r.prompt_indices if i >= 0]
        state.prompts = load_prompt_ledger(ctx.run_dir, version, lost)
        state.checkpointed = version
    dead = dead_timeline(ctx) - dead_before
    print(
        f"resumed at version {version} in learner epoch {state.weights_epoch}, prompt "
        f"{state.prompts.next_index} of the stream; {dead} logged group(s) sampled after "
        "the checkpoint dropped",
        file=ctx.console,
        flush=True,
    )


def dead_timeline(ctx: RunContext) -> int:
    """Groups the shards dropped as sampled from weights a fork took back, so far."""
    return sum(shard_drops(s).get("dead_timeline", 0) for s in ctx.state.shards.values())
