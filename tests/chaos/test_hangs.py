"""The chaos lane's hangs (issue 52 item 3): a role that stays alive but stops working. Its
heartbeat thread beats on, so silence never shows it; its progress does. Each run must reach
``run.max_steps`` with exit status 0, with nothing lost and every logged group scored once.

- A reward role wedged in a forward (``streamrl.failpoints``: its main thread sleeps, the GIL
  released): restarted for making no progress with requests in hand.
- A user's rule reward that hangs on some calls: abandoned by the generator's rule worker
  after ``scoring.rule_timeout_s``, its group refused and counted; the generator goes on.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support import (
    ONE_OF_EACH,
    assert_nothing_lost,
    events,
    finish_run,
    killed_on_error,
    launch_tiny,
)

from streamrl.buffers.log_history import scan_shard, shard_dirs

pytestmark = pytest.mark.slow

STEPS = 10

JUDGE = (
    "{judge: {model: tiny-random-llama, template: 'Q {prompt} A {response}', "
    "yes_tokens: ['1'], no_tokens: ['0'], min_verdict_mass: 0.0}, weight: 0.5, "
    "normalize: group}"
)
RULE = "{name: target_token_share, args: {token_id: 27}}"


def test_a_reward_role_wedged_in_a_forward_is_restarted(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    env = {**os.environ, "STREAMRL_FAILPOINT": "reward_role.score:0:6"}  # its 6th batch
    proc = launch_tiny(
        run_dir,
        f"run.max_steps={STEPS}",
        "run.stall_timeout_s=8",
        f"rewards=[{RULE}, {JUDGE}]",
        *ONE_OF_EACH,
        env=env,
    )
    with killed_on_error(proc):
        out, summary = finish_run(proc, run_dir)
    assert summary["version"] == STEPS
    assert summary["restarts"] == {"reward role 1": 1}, summary["restarts"]
    (restart,) = events(run_dir, "restart")
    assert restart["failure"].startswith("no progress for "), restart
    assert "with work in hand" in restart["failure"]
    (role,) = summary["scoring"]["roles"]
    assert role["incarnation"] == 1
    groups = [g for shard in shard_dirs(run_dir / "buffer") for g, _ in scan_shard(shard)]
    assert groups and all(g.scorers == [role["identity"]] for g in groups)
    assert_nothing_lost(summary, run_dir)


def test_a_hanging_rule_reward_refuses_its_group_and_the_run_goes_on(tmp_path: Path) -> None:
    """The rule hangs on every 25th response its process scores (the rule worker restarted
    after each hang starts counting again)."""
    plugin = tmp_path / "plugin"
    plugin.mkdir()
    (plugin / "hang_rule.py").write_text(
        "import itertools, time\n"
        "from streamrl.rewards import REWARDS\n"
        "_calls = itertools.count(1)\n"
        "def sometimes_hangs(inp, **kwargs):\n"
        "    if next(_calls) % 25 == 0:\n"
        "        time.sleep(3600)\n"
        "    return REWARDS['target_token_share'](inp, token_id=27)\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{plugin}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    run_dir = tmp_path / "run"
    proc = launch_tiny(
        run_dir,
        f"run.max_steps={STEPS}",
        "scoring.rule_timeout_s=2",
        "rewards=[{name: 'hang_rule:sometimes_hangs'}]",
        *ONE_OF_EACH,
        env=env,
    )
    with killed_on_error(proc):
        out, summary = finish_run(proc, run_dir)
    assert summary["version"] == STEPS
    assert not summary.get("restarts"), summary.get("restarts")  # nobody was replaced
    timeouts = sum(g.get("reward_timeouts", 0) for g in summary["generators"].values())
    assert timeouts > 0, summary["generators"]
    refused = sum(s["invalid"].get("unscored", 0) for s in summary["buffer"])
    assert refused >= timeouts, (refused, timeouts)
    assert_nothing_lost(summary, run_dir)
