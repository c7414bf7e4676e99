"""benchmarks/trl_peer.py (TRL's GRPOTrainer on a streamrl recipe) from the main venv, without
TRL: its recipe mapping, the prompts and rewards it trains on, and the eval's cut at a stop
token. Running the trainer needs .venv-trl (scripts/trl_venv.sh); that is skipped here."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from streamrl.config import default_config_path, load_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def peer():
    spec = importlib.util.spec_from_file_location("trl_peer", ROOT / "benchmarks" / "trl_peer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _default(*overrides: str):
    return load_config(default_config_path(), list(overrides))


def test_importing_the_peer_imports_no_trl_torch_or_transformers(peer) -> None:
    import subprocess

    path = str(ROOT / "benchmarks" / "trl_peer.py")
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('p', {path!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "print(sorted(k for k in ('trl', 'torch', 'transformers') if k in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_default_job_maps_to_grpo_config_kwargs(peer) -> None:
    config = _default("learner.micro_batch_size=32")
    gen, learner = config.generator, config.learner
    kwargs = peer.grpo_kwargs(config, bf16=True, output_dir="/tmp/x", seed=3)
    assert kwargs["num_generations"] == gen.group_size
    assert kwargs["max_completion_length"] == gen.max_new_tokens
    # groups_per_step prompts x group_size samples per step (8 x 8), in micro-batches of 32.
    assert learner.groups_per_step * gen.group_size == 64
    assert kwargs["per_device_train_batch_size"] == 32
    assert kwargs["gradient_accumulation_steps"] == 2
    assert kwargs["max_steps"] == config.run.max_steps and kwargs["seed"] == 3
    assert kwargs["learning_rate"] == learner.lr
    assert kwargs["warmup_steps"] == learner.warmup_steps
    assert learner.lr_schedule == "cosine"
    assert kwargs["lr_scheduler_type"] == "cosine_warmup_with_min_lr"
    assert kwargs["lr_scheduler_kwargs"] == {"min_lr_rate": learner.min_lr_ratio}
    assert (kwargs["adam_beta1"], kwargs["adam_beta2"]) == tuple(learner.betas)
    assert kwargs["weight_decay"] == learner.weight_decay
    assert kwargs["max_grad_norm"] == learner.grad_clip
    # token-mean (streamrl's default loss_agg) is TRL's dapo; GRPO's group-std advantage.
    assert config.algorithm.loss_agg == "token-mean" and config.algorithm.advantage == "grpo"
    assert kwargs["loss_type"] == "dapo" and kwargs["scale_rewards"] == "group"
    assert kwargs["beta"] == config.algorithm.kl.coef == 0.0
    assert kwargs["epsilon"] == kwargs["epsilon_high"] == 0.2
    assert kwargs["temperature"] == gen.temperature
    assert kwargs["top_p"] == 1.0 and kwargs["top_k"] == 0
    assert kwargs["gradient_checkpointing"] is False and kwargs["bf16"] is True
    assert kwargs["shuffle_dataset"] is False and kwargs["use_cpu"] is True
    notes = " ".join(peer.recipe_notes(config, kwargs))
    assert config.buffer.drop_zero_variance and "dynamic-sampling" in notes
    assert "setup_s" in notes


def test_other_recipes_map_or_are_refused(peer) -> None:
    config = _default(
        "learner.micro_batch_size=8",
        "learner.lr_schedule=constant",
        "algorithm.advantage=dr_grpo",
        "algorithm.loss_agg=seq-mean-token-mean",
        "algorithm.kl.coef=0.01",
    )
    kwargs = peer.grpo_kwargs(config, bf16=False, output_dir="/tmp/x", seed=0)
    assert kwargs["per_device_train_batch_size"] == 8
    assert kwargs["gradient_accumulation_steps"] == 8  # 64 samples a step
    assert kwargs["lr_scheduler_kwargs"] == {"min_lr_rate": 1.0}  # constant after warmup
    assert kwargs["scale_rewards"] == "none" and kwargs["loss_type"] == "grpo"
    assert kwargs["beta"] == 0.01 and kwargs["bf16"] is False
    for override in (
        "algorithm.advantage=rloo",
        "algorithm.loss_agg=seq-mean-token-sum",
        "learner.ppo_epochs=2",
        "algorithm.overlong_buffer.length=4",
    ):
        with pytest.raises(peer.RecipeError):
            peer.grpo_kwargs(_default(override), bf16=False, output_dir="/tmp/x", seed=0)


def test_the_lr_schedule_warms_up_as_streamrl_and_decays_one_step_ahead(peer) -> None:
    from functools import partial

    optimization = pytest.importorskip("transformers.optimization")
    from streamrl.workers.learning.train_step import lr_multiplier

    config = _default()
    kwargs = peer.grpo_kwargs(config, bf16=True, output_dir="/tmp/x", seed=0)
    hf = partial(
        optimization._get_cosine_with_min_lr_schedule_with_warmup_lr_rate_lambda,
        num_warmup_steps=kwargs["warmup_steps"],
        num_training_steps=kwargs["max_steps"],
        num_cycles=0.5,
        **kwargs["lr_scheduler_kwargs"],
    )
    steps = config.run.max_steps
    for step in range(config.learner.warmup_steps):
        assert hf(step) == pytest.approx(lr_multiplier(step, config))
    for step in range(config.learner.warmup_steps, steps):
        assert hf(step) == pytest.approx(lr_multiplier(step + 1, config))
    assert hf(steps - 1) == pytest.approx(config.learner.min_lr_ratio)


def test_rows_are_the_seeded_train_stream_and_the_reward_is_streamrls(peer) -> None:
    from streamrl.data import PromptStream

    config = _default()
    rows = peer.train_rows(config, 5, 6)
    stream = PromptStream(config.data, 5)
    assert [r["prompt"] for r in rows] == [stream[i].messages for i in range(6)]
    assert [r["ground_truth"] for r in rows] == [stream[i].ground_truth for i in range(6)]

    class Decoder:  # what the reward needs of a tokenizer: ids -> text (2 is the stop token)
        def decode(self, ids, skip_special_tokens=True):
            return "".join({1: "1", 3: "2", 9: "x", 2: ""}[t] for t in ids)

    config = _default(
        "rewards=[{name: numeric_match}, {name: stopped, args: {after: numeric_match}}]"
    )
    reward = peer.StreamrlReward(config, Decoder(), (2,))
    values = reward(
        prompts=None,
        completions=None,
        completion_ids=[[1, 3, 2], [1, 3], [9, 1, 3, 2], [1, 2]],
        ground_truth=["12"] * 4,
        data_source=["arithmetic"] * 4,
    )
    # numeric_match, plus 1 for a right answer the model ended itself (a stop token).
    assert values == [2.0, 1.0, 2.0, 0.0]
    per_step = config.learner.groups_per_step * config.generator.group_size
    assert reward.means == [[float(per_step), 1.25]]


def test_eval_rows_are_cut_after_the_first_stop_token(peer) -> None:
    assert peer.stop_and_cut([5, 6, 2, 2, 2], (2,)) == ([5, 6, 2], "stop")
    assert peer.stop_and_cut([5, 6, 7], (2,)) == ([5, 6, 7], "length")


def test_grpo_config_accepts_the_kwargs_where_trl_is_installed(peer, tmp_path) -> None:
    trl = pytest.importorskip("trl", reason="TRL lives in .venv-trl (scripts/trl_venv.sh)")
    kwargs = peer.grpo_kwargs(_default(), bf16=False, output_dir=str(tmp_path), seed=0)
    args = trl.GRPOConfig(**kwargs)
    assert args.generation_batch_size == 32 and args.steps_per_generation == 1


def _analysis(name: str):
    path = ROOT / "benchmarks" / "analysis" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_peer_levels_are_new_bests_and_a_run_is_timed_by_the_step_that_made_the_version(
    tmp_path: Path,
) -> None:
    import json

    levels = _analysis("peer_levels")
    peer = {
        "curve": [
            {"seconds": 5, "exact": 0.03},
            {"seconds": 100, "exact": 0.30},
            {"seconds": 200, "exact": 0.25},  # below the best so far: no new level
            {"seconds": 300, "exact": 0.40},
        ]
    }
    assert levels.peer_levels(peer, "exact") == [(0.30, 100.0), (0.40, 300.0)]
    # Steps 1-4 end at 10, 20, 30, 40 s of the run's clock (the first step took 10 s).
    records = [{"step": s, "time": 1000.0 + 10 * s, "time/step_s": 10.0} for s in (1, 2, 3, 4)]
    records += [
        {"event": "eval", "eval/version": 2, "eval/exact_match": 0.35},
        # Reported late and asked for v3, but the weights evaluated were v4's.
        {"event": "eval", "requested": 3, "eval/version": 4, "eval/exact_match": 0.45},
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    times = levels.times_to_levels(tmp_path, "eval/exact_match", [0.30, 0.40, 0.50])
    assert times == [20.0, 40.0, None]
