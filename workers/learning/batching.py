"""Turning trajectory groups into training tensors for the learner.

Every per-token tensor of a micro-batch is *response-aligned*: ``[B, T]`` with column ``j``
the trajectory's response token ``j`` (``T`` = the longest response; ``mask`` marks the real
ones). The forward runs on *rows* that hold the tokens, and ``gather`` picks, for each
trajectory and ``j``, the output at the column whose logits predict response token ``j``.

Two row layouts (``docs/design.md`` §5b):

- **one trajectory per row**, right-padded. Right padding with causal attention needs no
  attention mask: position ``c`` attends to positions ``<= c``, all real tokens of its own row,
  so the learner conditions on exactly the tokens the generator did, whatever the pad id
  (SmolLM2's pad is its end-of-turn token, which a mask built from ids would hide).
- **shared prompt**: a group's samples share their prompt, which one row holds once, followed
  by every sample's response: ``[prompt | response 1 | response 2 | ...]``. A 4-D attention
  mask lets each response see the prompt and its own earlier tokens only, and position ids
  restart after the prompt for each response, so every response token is computed from
  exactly the context it was sampled in; response 1's first token is predicted from the
  prompt's last column like all the others. The prompt is encoded once instead of once per
  sample: the default job's step (4 groups of 8, 29-token prompts, 8-token responses) trains
  372 tokens instead of 1,184. Prompts that begin alike (a chat template's system prompt)
  share a row as a prefix tree: ``[shared | rest of A | A's responses | rest of B | ...]``,
  each prompt's rest and responses seeing the shared tokens and their own branch only
  (``shared_prompts.tree_attention``). A micro-batch takes this layout only when its
  estimated cost is lower (``_cost``; every row is padded to the widest, and attention grows
  with the square of the width), and ``_packed`` cuts the prompts into the cheapest rows.

Only the columns from the first prediction on are asked of the model (``start``,
``logits_to_keep``), never the prompt's; in the shared layout only those that predict a
response token (``kept``). Example, plain: prompts of 5 and 7 tokens with 3-token
responses -> width 10, ``start`` 4; row 0's response is predicted from columns 4..6, row 1's
from 6..8, so ``columns`` (relative to ``start``) is ``[[0, 1, 2], [2, 3, 4]]``.

Which trajectories share a micro-batch is a *plan* (``micro_batch_rows``): runs of
``micro_batch_size`` in arrival order, or, with a token budget, trajectories sorted by length
and cut so that each micro-batch's padded tokens (rows x longest) stay within the budget. The
gradient does not depend on the plan or on the layout (``train_step``'s reduction rule), only
the work does. Each micro-batch keeps its trajectories' positions in the step (``rows``) to
pair them with per-trajectory values (scores, advantages) computed in arrival order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from streamrl.protocol import TrajectoryGroup
from streamrl.workers.shared_prompts import PADDING, SHARED, additive_mask, tree_attention


@dataclass
class MicroBatch:
    input_ids: torch.Tensor  # [S, W] the sequences the forward runs on, right-padded
    # [S, W, W] True where a column may attend to another (shared-prompt layout); None: plain
    # causal attention over one trajectory per sequence.
    attention: torch.Tensor | None
    positions: torch.Tensor | None  # [S, W] position ids with ``attention``, else None
    start: int  # first column whose output is kept (``logits_to_keep``)
    source: torch.Tensor  # [B] int64 the sequence holding each trajectory
    # [B, T] int64 which of the kept outputs predicts response token j: column - start, or
    # the index into ``kept`` where that is given
    columns: torch.Tensor
    targets: torch.Tensor  # [B, T] response tokens (pad beyond each response)
    mask: torch.Tensor  # [B, T] 1.0 on the policy's response tokens (not the environment's)
    behavior: torch.Tensor  # [B, T] behaviour logprobs of the response tokens
    versions: torch.Tensor  # [B, T] int64 weight version that sampled each token (-1 beyond)
    temperatures: torch.Tensor  # [B] sampling temperature of each response
    response_lengths: torch.Tensor  # [B]
    rows: torch.Tensor  # [B] int64 position of each trajectory among the step's trajectories
    # The one sampling temperature of every row; None when rows differ (scale row by row).
    temperature: float | None
    # On-policy distillation (``rewards: - teacher``): the teachers' logprobs of the response
    # tokens and each row's coefficient (0: no teacher); None when no row has a teacher.
    teacher: torch.Tensor | None = None  # [B, T]
    teacher_coef: torch.Tensor | None = None  # [B]
    # A top-k teacher's k tokens per position, their logprobs, each row's weight (0: none).
    teacher_top_ids: torch.Tensor | None = None  # [B, T, k] int64
    teacher_top_logprobs: torch.Tensor | None = None  # [B, T, k]
    teacher_top_coef: torch.Tensor | None = None  # [B]
    # [B] True on a guided reference response (``Trajectory.guided``: never sampled, its
    # behaviour logprobs unknown); None when no row is one.
    guided: torch.Tensor | None = None
    # Filled in by the training step:
    advantages: torch.Tensor | None = None  # [B] (group estimators) or [B, T] (GAE)
    returns: torch.Tensor | None = None  # [B, T] GAE returns (critic only)
    old_values: torch.Tensor | None = None  # [B, T] values before this step (critic only)
    proximal: torch.Tensor | None = None  # [B, T] logprobs at the step's starting weights
    ref_logprobs: torch.Tensor | None = None  # [B, T] reference-model logprobs
    # The shared-prompt layout's kept columns ([K] int64, ascending): only those that predict
    # a response token, not every column from ``start`` on (a packed row's other prompts'
    # tokens would cost a vocabulary-wide projection each). None: every column from ``start``.
    kept: torch.Tensor | None = None

    def to(self, device: torch.device) -> MicroBatch:
        """The tensors on ``device``, copied once per step before any forward (from pinned
        memory, without blocking): a pageable copy in the loop would stall the GPU queue."""
        if device.type == "cpu":
            return self
        for name in _ON_DEVICE:
            tensor = getattr(self, name)
            if tensor is not None and tensor.device != device:
                setattr(self, name, tensor.pin_memory().to(device, non_blocking=True))
        return self

    @property
    def keep(self) -> int | torch.Tensor:
        """``logits_to_keep`` for the forward: the columns in ``kept``, else the last
        ``W - start``."""
        return self.kept if self.kept is not None else self.input_ids.shape[1] - self.start

    def kept_outputs(self, outputs: torch.Tensor) -> torch.Tensor:
        """``outputs`` of every column ([S, W, ...], e.g. a critic's values) -> those the
        forward's ``logits_to_keep`` would keep, which ``columns`` index."""
        return outputs[:, self.kept] if self.kept is not None else outputs[:, self.start :]

    def column(self, b: int, j: int) -> int:
        """The column of trajectory ``b``'s sequence whose output predicts its response
        token ``j``."""
        kept = int(self.columns[b, j])
        return int(self.kept[kept]) if self.kept is not None else self.start + kept

    @property
    def shares_prompts(self) -> bool:
        return self.attention is not None

    def model_inputs(self, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """The forward's keyword arguments: the ids, and in the shared-prompt layout an
        additive mask with the position ids. The mask has the forward's compute ``dtype``
        (eager attention adds it to its scores, SDPA takes it as is), and its blocked value is
        bfloat16's lowest, finite in float32 and bfloat16 alike.

        Why the compute dtype: SDPA's cuDNN backend, the default on Hopper GPUs (torch 2.11),
        reads a float32 mask beside bf16 queries as bf16, element by element, without an
        error (pytorch/pytorch#191612); on an H100 the learner's bf16 logprobs then missed the
        engine's by 0.58 on average. FSDP2 casts floating inputs to its ``param_dtype``, one
        rank's ``ComputeImage`` does not, so the mask is made in that dtype here."""
        inputs = {"input_ids": self.input_ids}
        if self.attention is not None:
            inputs["attention_mask"] = additive_mask(self.attention, dtype)
            inputs["position_ids"] = self.positions
        return inputs

    def gather(self, kept: torch.Tensor) -> torch.Tensor:
        """``kept`` ([S, W - start, ...], the forward's outputs from ``start`` on) ->
        ``[B, T, ...]``: for each trajectory, the outputs that predict its response tokens."""
        return kept[self.source[:, None], self.columns]

    def __len__(self) -> int:
        return self.source.shape[0]


# What the forward and the losses read; temperatures and lengths stay on the host (read there).
_ON_DEVICE = (
    "input_ids",
    "attention",
    "positions",
    "source",
    "columns",
    "targets",
    "mask",
    "behavior",
    "versions",
    "advantages",
    "returns",
    "old_values",
    "proximal",
    "ref_logprobs",
    "kept",
    "teacher",
    "teacher_coef",
    "teacher_top_ids",
    "teacher_top_logprobs",
    "teacher_top_coef",
    "guided",
)


def build_micro_batches(
    groups: list[TrajectoryGroup],
    size: int,
    pad_id: int,
    *,
    plan: list[list[int]] | None = None,
    first_row: int = 0,
    share_prompts_hidden: int = 0,
) -> list[MicroBatch]:
    """Micro-batches of ``groups``' trajectories, built from the wire's raw arrays
    (``torch.frombuffer`` on each chunk's bytes, joined once; no per-token Python work).

    ``plan`` lists each micro-batch's trajectories by index (default: runs of ``size`` in
    order); ``first_row`` is the step position of ``groups``' first trajectory.
    ``share_prompts_hidden``: the model's hidden size, to let a micro-batch take the
    shared-prompt layout where it costs less (0: one trajectory per sequence always)."""
    trajectories = [t for g in groups for t in g.trajectories]
    if plan is None:
        plan = micro_batch_rows([0] * len(trajectories), size)
    return [
        _micro_batch(
            [trajectories[i] for i in rows],
            pad_id,
            torch.tensor(rows) + first_row,
            share_prompts_hidden,
        )
        for rows in plan
    ]


def micro_batch_rows(lengths: Sequence[int], size: int, token_budget: int = 0) -> list[list[int]]:
    """Each micro-batch's trajectories, by index into ``lengths`` (tokens per trajectory).

    Without a budget: runs of ``size`` in order. With one: longest first (the largest
    activations come first, so a budget too big for memory fails on the first micro-batch),
    filled greedily while rows x longest <= ``token_budget``; a trajectory longer than the
    budget goes alone. Example: lengths [3, 9, 4, 8], budget 16 -> [[1], [3, 2], [0]]."""
    if token_budget <= 0:
        return [list(range(i, min(i + size, len(lengths)))) for i in range(0, len(lengths), size)]
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    plan: list[list[int]] = []
    for i in order:
        # Sorted longest first: the chunk's width is that of its first row.
        if plan and (len(plan[-1]) + 1) * lengths[plan[-1][0]] <= token_budget:
            plan[-1].append(i)
        else:
            plan.append([i])
    return plan


def resize_plan(plan: list[list[int]], lengths: Sequence[int], count: int) -> list[list[int]]:
    """``plan`` with exactly ``count`` micro-batches (under FSDP every rank must run as many
    forward and backward passes): while too few, the costliest one with two or more rows is
    halved; while too many, the two neighbours whose union pads the fewest tokens merge.
    ``1 <= count <= len(lengths)``."""
    if not 1 <= count <= len(lengths):
        raise ValueError(f"cannot plan {count} micro-batches for {len(lengths)} trajectories")

    def padded(rows: list[int]) -> int:
        return len(rows) * max(lengths[i] for i in rows)

    plan = [list(rows) for rows in plan]
    while len(plan) < count:
        k = max((k for k in range(len(plan)) if len(plan[k]) > 1), key=lambda k: padded(plan[k]))
        half = len(plan[k]) // 2
        plan[k : k + 1] = [plan[k][:half], plan[k][half:]]
    while len(plan) > count:
        k = min(range(len(plan) - 1), key=lambda k: padded(plan[k] + plan[k + 1]))
        plan[k : k + 2] = [plan[k] + plan[k + 1]]
    return plan


def _cost(sequences: int, width: int, hidden: int) -> float:
    """A forward's work in token-equivalents: the layers' per-token matmuls, plus attention,
    whose scores and weighted sum cost about ``width / (6 * hidden)`` of a token's matmuls
    per column attended (4 h^2 + 8 h^2 per token for the projections and the MLP, against
    2 h per pair)."""
    return sequences * width * (1 + width / (6 * hidden))


# The row widths ``_packed`` tries at most: enough for the default job's 8 prompts (every
# width of every run is 36), a bound for a micro-batch of hundreds.
CUT_WIDTHS = 64


@dataclass(frozen=True)
class _Family:
    """The trajectories of one prompt in a micro-batch (indices into it)."""

    prompt: list[int]
    members: list[int]
    responses: int  # their response tokens, in all


@dataclass(frozen=True)
class _Row:
    """One sequence of the shared-prompt layout: ``families`` (sorted by prompt), the first
    ``shared`` tokens of whose prompts are alike and held once."""

    families: list[_Family]
    shared: int

    @property
    def width(self) -> int:
        return self.shared + sum(len(f.prompt) - self.shared + f.responses for f in self.families)


def _common(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _packed(families: list[_Family], hidden: int) -> list[_Row]:
    """The cheapest cut (``_cost``) of ``families``, sorted by prompt, into runs of one row
    each. In sorted order the tokens a run's prompts share are the least of its neighbours'
    (``_common``), and a run widens as it grows, so for each width allowed the greedy cut is
    the fewest rows; the runs' widths are tried (``CUT_WIDTHS`` of them at most, spread over
    their range). Example: the default job's 8 groups of 8 (prompts of 37-45 tokens, 24 of
    them a chat template's system prompt, responses of ~9) cost 8 rows x 112 columns apart
    and 4 rows x ~205 packed."""
    families = sorted(families, key=lambda f: f.prompt)
    n = len(families)
    sums = [0]  # of prompt + responses, the families before each index
    for f in families:
        sums.append(sums[-1] + len(f.prompt) + f.responses)
    near = [_common(families[t].prompt, families[t + 1].prompt) for t in range(n - 1)]

    def width(i: int, j: int, shared: int) -> int:  # families i..j, ``shared`` tokens alike
        return sums[j + 1] - sums[i] - (j - i) * shared

    widths = set()
    for i in range(n):
        shared = len(families[i].prompt)
        for j in range(i, n):
            shared = min(shared, near[j - 1]) if j > i else shared
            widths.add(width(i, j, shared))
    widest = max(width(i, i, len(families[i].prompt)) for i in range(n))
    caps = sorted(w for w in widths if w >= widest)
    caps = (
        [caps[k * len(caps) // CUT_WIDTHS] for k in range(CUT_WIDTHS)]
        if len(caps) > CUT_WIDTHS
        else caps
    )
    best: tuple[float, list[_Row]] | None = None
    for cap in caps:
        rows, i = [], 0
        while i < n:
            j, shared = i, len(families[i].prompt)
            while j + 1 < n and width(i, j + 1, min(shared, near[j])) <= cap:
                shared = min(shared, near[j])
                j += 1
            rows.append(_Row(families[i : j + 1], shared))
            i = j + 1
        cost = _cost(len(rows), max(r.width for r in rows), hidden)
        if best is None or cost < best[0]:
            best = (cost, rows)
    assert best is not None
    return best[1]


def _rows(chunk: list, hidden: int) -> list[_Row] | None:
    """The shared-prompt layout's rows when it costs less than one trajectory per sequence
    (``hidden`` > 0), else None. A row holds a prompt once with every response to it, and
    several prompts that begin alike as a prefix tree (``shared_prompts.tree_attention``)."""
    if hidden <= 0 or not chunk:
        return None
    members: dict[bytes, list[int]] = {}
    for i, t in enumerate(chunk):
        members.setdefault(t.prompt_ids, []).append(i)
    families = [
        _Family(chunk[m[0]].prompt_list(), m, sum(chunk[i].num_response_tokens for i in m))
        for m in members.values()
    ]
    rows = _packed(families, hidden)
    plain_width = max(t.num_prompt_tokens + t.num_response_tokens for t in chunk)
    packed_cost = _cost(len(rows), max(r.width for r in rows), hidden)
    return rows if packed_cost < _cost(len(chunk), plain_width, hidden) else None


def _micro_batch(chunk: list, pad_id: int, rows: torch.Tensor, hidden: int) -> MicroBatch:
    packed = _rows(chunk, hidden)
    prompt = torch.tensor([t.num_prompt_tokens for t in chunk])
    response = torch.tensor([t.num_response_tokens for t in chunk])
    if packed is None:
        # One trajectory per sequence: the prompt then the response, causal attention.
        source = torch.arange(len(chunk))
        first = opens = prompt
        lengths = (prompt + response).tolist()
        parts: Iterable[bytes] = (p for t in chunk for p in (t.prompt_ids, t.response_ids))
    else:
        source, first, opens, lengths, parts = _tree_columns(chunk, packed)
    width = max(lengths)
    columns = torch.arange(width)
    ids = torch.full((len(lengths), width), pad_id, dtype=torch.long)
    # Boolean-mask assignment fills row by row, left to right: the order of the bytes.
    ids[columns < torch.tensor(lengths)[:, None]] = _joined(parts, torch.int32).long()
    attention = positions = None
    if packed is not None:
        attention, positions = _tree_attention(chunk, packed, width)
    # Response token j of a trajectory is predicted from column first + j - 1; token 0 from
    # the prompt's last column (the same one for every response sharing that prompt).
    steps = torch.arange(int(response.max()) if len(chunk) else 0)
    is_response = steps < response[:, None]
    predicted_from = first[:, None] - 1 + steps
    predicted_from[:, :1] = (opens - 1)[:, None]
    start = max(int(opens.min()) - 1, 0)
    kept = None
    if packed is not None:
        # Only the columns that predict a token: in a packed row, other prompts' own tokens
        # lie between them.
        kept = torch.unique(predicted_from[is_response])
        kept = kept if len(kept) else torch.tensor([start])
        predicted_from = torch.searchsorted(kept, predicted_from.clamp(max=int(kept[-1])))
        start = int(kept[0])
    else:
        predicted_from = predicted_from - start
    targets = torch.full(is_response.shape, pad_id, dtype=torch.long)
    targets[is_response] = _joined((t.response_ids for t in chunk), torch.int32).long()
    behavior = torch.zeros(is_response.shape)
    behavior[is_response] = _joined((t.behavior_logprobs for t in chunk), torch.float32)
    # Environment tokens of an episode (action mask 0) are context: masked out of everything.
    mask = torch.zeros(is_response.shape)
    mask[is_response] = _joined((t.policy_mask() for t in chunk), torch.uint8).float()
    versions = torch.full(is_response.shape, -1, dtype=torch.long)
    versions[is_response] = _joined((t.token_versions for t in chunk), torch.int32).long()
    temperatures = torch.tensor([t.temperature for t in chunk])
    uniform = bool((temperatures == temperatures[0]).all())
    teacher = teacher_coef = None
    if any(t.teacher_coef > 0 for t in chunk):
        teacher_coef = torch.tensor([t.teacher_coef for t in chunk], dtype=torch.float32)
        teacher = torch.zeros(is_response.shape)
        # A row no teacher scored has coefficient 0: its own logprobs fill the slots.
        teacher[is_response] = _joined(
            (t.teacher_logprobs if t.teacher_coef > 0 else t.behavior_logprobs for t in chunk),
            torch.float32,
        )
    top_ids, top_logprobs, top_coef = _teacher_top_k(chunk, is_response)
    return MicroBatch(
        input_ids=ids,
        attention=attention,
        positions=positions,
        start=start,
        source=source,
        # Beyond a response, any kept column (masked out of every loss and figure).
        columns=torch.where(is_response, predicted_from, 0),
        targets=targets,
        mask=mask,
        behavior=behavior,
        versions=versions,
        temperatures=temperatures,
        response_lengths=response,
        rows=rows,
        temperature=float(temperatures[0]) if uniform else None,
        teacher=teacher,
        teacher_coef=teacher_coef,
        teacher_top_ids=top_ids,
        teacher_top_logprobs=top_logprobs,
        teacher_top_coef=top_coef,
        guided=torch.tensor([t.guided for t in chunk]) if any(t.guided for t in chunk) else None,
        kept=kept,
    )


def _tree_columns(
    chunk: list, packed: list[_Row]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int], list[bytes]]:
    """Where each trajectory lies in the packed rows: its sequence, its response's first
    column, the column after its prompt; each row's length; the rows' tokens in order, as
    raw arrays: ``[shared | rest of prompt A | A's responses | rest of prompt B | ...]``."""
    source = torch.empty(len(chunk), dtype=torch.long)
    first = torch.empty(len(chunk), dtype=torch.long)
    opens = torch.empty(len(chunk), dtype=torch.long)
    lengths: list[int] = []
    parts: list[bytes] = []
    for s, row in enumerate(packed):
        cut = 4 * row.shared  # prompt_ids: int32 little-endian
        parts.append(chunk[row.families[0].members[0]].prompt_ids[:cut])
        column = row.shared
        for family in row.families:
            parts.append(chunk[family.members[0]].prompt_ids[cut:])
            column += len(family.prompt) - row.shared
            opened = column
            for i in family.members:
                source[i], first[i], opens[i] = s, column, opened
                parts.append(chunk[i].response_ids)
                column += chunk[i].num_response_tokens
        lengths.append(column)
    return source, first, opens, lengths, parts


def _tree_attention(
    chunk: list, packed: list[_Row], width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The packed rows' attention ([S, W, W]) and position ids ([S, W]): each column's
    branch and segment (``shared_prompts.tree_attention``) and its position in its own
    trajectory, the positions it was sampled at."""
    branch = torch.full((len(packed), width), PADDING, dtype=torch.long)
    segment = torch.zeros((len(packed), width), dtype=torch.long)
    positions = torch.zeros((len(packed), width), dtype=torch.long)
    for s, row in enumerate(packed):
        branch[s, : row.shared] = SHARED
        positions[s, : row.shared] = torch.arange(row.shared)
        column, number = row.shared, 0
        for f, family in enumerate(row.families):
            size = len(family.prompt)
            rest = size - row.shared
            branch[s, column : column + rest] = f
            positions[s, column : column + rest] = torch.arange(row.shared, size)
            column += rest
            for i in family.members:
                n, number = chunk[i].num_response_tokens, number + 1
                branch[s, column : column + n] = f
                segment[s, column : column + n] = number
                positions[s, column : column + n] = torch.arange(size, size + n)
                column += n
    return tree_attention(branch, segment), positions


def _teacher_top_k(
    chunk: list, is_response: torch.Tensor
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """A top-k teacher's arrays as [B, T, k] (rows without: token 0 at logprob -inf, so that
    its weight q = 0), and each row's weight; Nones when no row has them."""
    taught = [t for t in chunk if t.teacher_top_coef > 0]
    if not taught:
        return None, None, None
    k = len(taught[0].teacher_top_ids) // len(taught[0].response_ids)
    if any(len(t.teacher_top_ids) != k * len(t.response_ids) for t in taught):
        raise ValueError("one micro-batch holds top-k teacher arrays of different k")
    shape = (*is_response.shape, k)
    ids = torch.zeros(shape, dtype=torch.long)
    logprobs = torch.full(shape, float("-inf"))
    rows = torch.tensor([t.teacher_top_coef > 0 for t in chunk])
    where = is_response & rows[:, None]
    ids[where] = _joined((t.teacher_top_ids for t in taught), torch.int32).long().view(-1, k)
    logprobs[where] = _joined((t.teacher_top_logprobs for t in taught), torch.float32).view(-1, k)
    coef = torch.tensor([t.teacher_top_coef for t in chunk], dtype=torch.float32)
    return ids, logprobs, coef


def in_step_order(batches: list[MicroBatch], values: list[torch.Tensor]) -> torch.Tensor:
    """Per-row ``values`` of each micro-batch ([B] each), as one tensor in step order."""
    rows = torch.cat([b.rows for b in batches])
    out = torch.empty(len(rows), dtype=values[0].dtype)
    out[rows] = torch.cat(values)
    return out


def split_groups(groups: list[TrajectoryGroup], parts: int) -> list[list[TrajectoryGroup]]:
    """``parts`` equal runs of whole groups (PPO mini-batches); ``len(groups) % parts == 0``."""
    if parts < 1 or len(groups) % parts:
        raise ValueError(f"cannot split {len(groups)} groups into {parts} equal mini-batches")
    size = len(groups) // parts
    return [groups[i : i + size] for i in range(0, len(groups), size)]


def _joined(parts: Iterable[bytes], dtype: torch.dtype) -> torch.Tensor:
    """The raw arrays ``parts`` (little-endian, as the wire carries them), concatenated: one
    copy, into a writable buffer that the tensor then shares."""
    data = bytearray().join(parts)
    return torch.frombuffer(data, dtype=dtype) if data else torch.zeros(0, dtype=dtype)
