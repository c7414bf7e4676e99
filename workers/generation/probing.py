"""Probe sampling (``generator.probe_candidates``, K >= 2): each granted group's prompt is
chosen among K candidates by one sampled response of each, its probe.

Why: a peaked policy samples the same response again and again, and a group whose samples
all score alike carries no GRPO signal (``buffer.drop_zero_variance`` drops it): most of the
default job's generation was lost so (docs/experiments.md). The chance that a new sample
repeats a probe ``y`` is ``p(y) = exp(sum of y's behaviour logprobs)``: both engines record
the sampling distribution's own logprobs (temperature applied), so ``p(y)`` is that chance
exactly, and a group of G whose rewards depend on the text alone is all alike with chance at
least ``p(y) ** (G - 1)``. Of a grant's N x K candidates the N whose probes were least likely
are sampled in full: the probe is the group's first response and G - 1 more are sampled in one
engine call. The other probes are passed over: their prompts are never generated again (the
stream moves on, as with the difficulty sampler) and their tokens are counted lost as
``probe`` (``controller.generation_yield``). The prediction needs no history, so it works on
questions never seen before.

What it does not see: responses that differ yet score alike (long reasoning that always
differs in its words); there every probe is unlikely and the choice falls back to the order
the prompts came in, at a cost of K - 1 probe responses per group. So it is off unless a job
turns it on.

Bias, stated: the chosen group's first response was selected for being unlikely, so it is
over-represented against an unselected sample. The same kind of selection as DAPO's dynamic
sampling (every sample of a kept group is conditioned on the group varying); the responses
sampled after the probe are the policy's own.

Example: N = 2, K = 3, candidate probes' logprob sums [-0.01, -2.3, -0.2, -0.05, -0.4, -0.01]:
candidates 1 and 4 are sampled in full (G - 1 more each); 0, 2, 3, 5 are passed over.
"""

from __future__ import annotations

from dataclasses import dataclass

from streamrl.workers.engines import Engine, GenerationOutput, SamplingParams
from streamrl.workers.engines.base import StepHook


def least_likely(logprob_sums: list[float], n: int) -> list[int]:
    """The positions of the ``n`` lowest sums (the least likely probes), in candidate order;
    ties go to the earlier candidate, so a run whose probes all tie takes the stream's order."""
    ranked = sorted(range(len(logprob_sums)), key=lambda i: (logprob_sums[i], i))
    return sorted(ranked[:n])


@dataclass(frozen=True)
class Probed:
    """A grant's groups sampled through probes: ``chosen`` (positions among the candidates,
    one per granted group, in order) and each chosen candidate's ``group_size`` outputs, its
    probe first; ``passed_over_tokens``: the tokens of the probes not chosen."""

    chosen: list[int]
    outputs: list[GenerationOutput]
    passed_over_tokens: int


def sample_probed(
    engine: Engine,
    candidates: list[list[int]],
    n: int,
    group_size: int,
    params: SamplingParams,
    on_step: StepHook | None,
) -> Probed:
    """Probe every candidate prompt (token ids) once, choose the ``n`` least likely, and
    sample ``group_size - 1`` more responses of each in a second engine call."""
    probes = engine.generate(candidates, params, on_step)
    chosen = least_likely([sum(out.logprobs) for out in probes], n)
    rest_size = group_size - 1
    rest = (
        engine.generate([candidates[c] for c in chosen for _ in range(rest_size)], params, on_step)
        if rest_size > 0
        else []
    )
    outputs: list[GenerationOutput] = []
    for k, c in enumerate(chosen):
        outputs.append(probes[c])
        outputs.extend(rest[k * rest_size : (k + 1) * rest_size])
    kept = set(chosen)
    passed = sum(len(out.response_ids) for i, out in enumerate(probes) if i not in kept)
    return Probed(chosen, outputs, passed)
