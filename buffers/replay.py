"""The replay store of one buffer shard: admission, eviction and sampling, as a pure policy.

No sockets, no threads, no torch. The shard server owns the sockets and calls these methods
from its one loop thread; the store depends only on something that knows the learner's
current version (``VersionProvider``), so tests drive it with a fake, and
reads groups through the small ``Group`` protocol.

Staleness (docs/design.md §3): with the learner at version ``v`` (optimizer steps done), a group's
staleness is ``v - group.min_version``. It is checked at admission (``offer``) and again, as
the version advances, before every sample (``take``); a group past ``max_staleness`` is
dropped and counted as ``"stale"``.

Complexity, with ``n`` stored groups:
- ``offer``: O(log n) (two heap pushes; drop-oldest pops the OrderedDict's head, O(1)).
- ``take(k)``: stale eviction O(log n) per evicted group, then
  fifo O(skipped + k), freshest O(k log n), random O(n) (a scan for eligible groups, then
  ``random.sample``; fine at buffer sizes of thousands of groups).
- ``peek(k)``: as ``take`` with fifo or freshest (random peeks in fifo order).
- ``stats``: O(n) (the staleness histogram is computed on demand).
The heaps use lazy deletion and are rebuilt when more than half of their entries are dead,
so memory stays O(n).
"""

from __future__ import annotations

import dataclasses
import enum
import heapq
import random
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from streamrl.algorithms.group_filter import has_reward_variance
from streamrl.config import key_rule
from streamrl.config.key_rules import Overflow, Sampling

# Every reason a group can leave the store (or be refused) other than being used up.
# ``dead_timeline``: sampled from weights a learner restart took back (``streamrl.clock``).
DROP_REASONS = (
    "stale",
    "duplicate",
    "zero_variance",
    "too_large",
    "overflow",
    "capacity",
    "dead_timeline",
    "invalid",  # refused at the shard's door (``frames.refusal``): would poison a learner
)


class Group(Protocol):
    """What the store reads of a group. ``TrajectoryGroup`` is one; the shard server stores a
    lighter summary that keeps the frame the group arrived in (``frames.StoredGroup``)."""

    @property
    def group_id(self) -> str: ...
    @property
    def min_version(self) -> int: ...
    @property
    def max_version(self) -> int: ...
    @property
    def weights_epoch(self) -> int: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def policy_tokens(self) -> int: ...  # sampled by the policy: the tokens_by_fate unit
    @property
    def nbytes(self) -> int: ...  # array payload: the ``bytes`` statistic
    @property
    def rewards(self) -> list[float]: ...
    @property
    def distilled(self) -> bool: ...  # a teacher scored it: it teaches whatever its rewards
    @property
    def finished_at(self) -> float: ...


G = TypeVar("G", bound=Group)


class VersionProvider(Protocol):
    """The learner's clock as the store reads it (``streamrl.clock.LearnerClock`` is one)."""

    def current_version(self) -> int:
        """The learner version: optimizer steps completed (initial weights are 0)."""
        ...

    def on_timeline(self, epoch: int, max_version: int) -> bool:
        """Whether weights of ``epoch`` up to ``max_version`` still exist (no learner restart
        took them back)."""
        ...


@dataclass(frozen=True)
class ReplayPolicy:
    """The knobs of one shard. Frozen: ``ReplayStore.reconfigure`` swaps the whole policy."""

    capacity: int = 256  # in groups
    capacity_tokens: int | None = None  # optional second bound on sum(group.num_tokens)
    max_staleness: int = 2
    sampling: Sampling = "fifo"
    max_reuse: int = 1  # a group leaves the store after being returned this many times
    overflow: Overflow = "drop-oldest"
    drop_zero_variance: bool = False  # drop groups whose rewards are all equal (no GRPO signal)

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            check_policy_value(field.name, getattr(self, field.name))


def check_policy_value(name: str, value: Any) -> None:
    """Raise ``ValueError`` with a one-line reason naming ``name`` if ``value`` is invalid.

    The rule is the type of the config key ``buffer.<name>`` (``streamrl.config.key_rule``),
    which the config and the admin API check too: a shard refuses exactly what they refuse (a
    policy built by hand or a ``Reconfigure`` from another client included).
    """
    fields = [f.name for f in dataclasses.fields(ReplayPolicy)]
    if name not in fields:
        raise ValueError(f"unknown buffer setting {name!r} (known: {', '.join(fields)})")
    problem = key_rule(f"buffer.{name}").problem(value)
    if problem is not None:
        raise ValueError(f"buffer setting {name!r} {problem}")


class Offer(enum.StrEnum):
    """What ``ReplayStore.offer`` did with a group. Compares equal to its string value."""

    ACCEPTED = "accepted"
    FULL = "full"  # overflow=block only: not stored; the caller must retry later (backpressure)
    STALE = "stale"
    DUPLICATE = "duplicate"
    ZERO_VARIANCE = "zero_variance"
    TOO_LARGE = "too_large"  # more tokens than capacity_tokens: could never fit
    DEAD_TIMELINE = "dead_timeline"  # sampled from weights a learner restart took back


@dataclass(slots=True)
class _Entry(Generic[G]):
    group: G
    min_version: int
    num_tokens: int
    nbytes: int
    uses: int = 0


class ReplayStore(Generic[G]):
    """A bounded, staleness-aware store of trajectory groups.

    Invariants:
    - every stored group satisfies ``version - min_version <= max_staleness`` at the moment it
      was last checked (``offer`` checks on the way in, ``take``/``evict_stale`` as the
      version advances), and has been returned fewer than ``max_reuse`` times;
    - ``len(store) <= capacity`` and stored tokens ``<= capacity_tokens`` after every call;
    - every ``offer`` ends in exactly one of: stored, used up, dropped (counted by reason in
      ``stats()["dropped"]``) or refused as full (``refused_full``, the caller still holds it):
      ``offered == size + retired + sum(dropped) + refused_full``.

    Example (max_staleness=1, the learner at version 3)::

        store.offer(group_with_min_version_2)   # "accepted": staleness 3 - 2 = 1
        store.offer(group_with_min_version_1)   # "stale":    staleness 2 > 1, dropped
        versions.version = 4                    # the learner steps
        store.take(8)                           # [] — the v2 group is now stale, evicted
    """

    def __init__(
        self,
        policy: ReplayPolicy,
        versions: VersionProvider,
        *,
        seed: int = 0,
        on_remove: Callable[[str, str], None] | None = None,
        dedup_window: int = 65536,
    ) -> None:
        """``on_remove(group_id, reason)`` is called whenever a stored group leaves the store;
        ``reason`` is ``"consumed"`` (used ``max_reuse`` times) or a drop reason. The shard
        server uses it to mark groups consumed in the durable log. ``dedup_window``: how many
        recently accepted group ids are remembered to refuse re-sent groups as duplicates
        (stored groups are always remembered)."""
        self._policy = policy
        self._versions = versions
        self._rng = random.Random(seed)
        self._on_remove = on_remove
        self._dedup_window = dedup_window
        self._entries: OrderedDict[int, _Entry[G]] = OrderedDict()  # seq -> entry, oldest first
        self._seq_of: dict[str, int] = {}  # stored group_id -> seq
        self._recent_ids: OrderedDict[str, None] = OrderedDict()
        # Lazy-deletion heaps over stored seqs: an item is dead once its seq left _entries.
        self._by_version: list[tuple[int, int]] = []  # (min_version, seq): stalest first
        self._by_freshness: list[tuple[int, int]] = []  # (-min_version, seq): freshest first
        self._next_seq = 0
        self._tokens = 0
        self._policy_tokens = 0  # of the stored groups (``stats()["stored_policy_tokens"]``)
        self._bytes = 0
        self._offered = 0
        self._ingested = 0
        self._consumed = 0  # groups returned by take, counting every reuse
        self._retired = 0  # groups that left after their last use
        self._refused_full = 0
        self._dropped = dict.fromkeys(DROP_REASONS, 0)
        # Policy tokens by what became of their group: "trained" at its first take, else its
        # drop reason (the useful-generation figure, ``controller.generation_yield``).
        self._tokens_by_fate: Counter[str] = Counter()

    @property
    def policy(self) -> ReplayPolicy:
        return self._policy

    def __len__(self) -> int:
        return len(self._entries)

    # ------------------------------------------------------------------ admission

    def offer(self, group: G) -> Offer:
        """Admit ``group`` or say why not; every refusal but ``FULL`` is counted as a drop."""
        self._offered += 1
        policy = self._policy
        gid = group.group_id
        if gid in self._seq_of or gid in self._recent_ids:
            return self._refuse(Offer.DUPLICATE, group)
        if not self._versions.on_timeline(group.weights_epoch, group.max_version):
            return self._refuse(Offer.DEAD_TIMELINE, group)
        min_version = group.min_version
        if self._versions.current_version() - min_version > policy.max_staleness:
            return self._refuse(Offer.STALE, group)
        if (
            policy.drop_zero_variance
            and not group.distilled
            and not has_reward_variance(group.rewards)
        ):
            return self._refuse(Offer.ZERO_VARIANCE, group)
        num_tokens = group.num_tokens
        if policy.capacity_tokens is not None and num_tokens > policy.capacity_tokens:
            return self._refuse(Offer.TOO_LARGE, group)
        if not self._fits(num_tokens):
            if policy.overflow == "block":
                self._refused_full += 1
                return Offer.FULL
            while not self._fits(num_tokens):
                self._remove(next(iter(self._entries)), "overflow")
        self._insert(group, min_version, num_tokens)
        return Offer.ACCEPTED

    def refuse_invalid(self) -> None:
        """Count a group the caller refused before offering it (``frames.refusal``) as
        offered and dropped ``"invalid"``, so the store's totals balance. Its tokens are not
        counted: its arrays are what made it invalid."""
        self._offered += 1
        self._dropped["invalid"] += 1

    def _refuse(self, reason: Offer, group: G) -> Offer:
        self._dropped[reason.value] += 1
        self._tokens_by_fate[reason.value] += group.policy_tokens
        return reason

    def _fits(self, num_tokens: int) -> bool:
        cap_tokens = self._policy.capacity_tokens
        return len(self._entries) < self._policy.capacity and (
            cap_tokens is None or self._tokens + num_tokens <= cap_tokens
        )

    def _insert(self, group: G, min_version: int, num_tokens: int) -> None:
        seq = self._next_seq
        self._next_seq += 1
        entry = _Entry(group, min_version, num_tokens, group.nbytes)
        self._entries[seq] = entry
        self._seq_of[group.group_id] = seq
        self._recent_ids[group.group_id] = None
        if len(self._recent_ids) > self._dedup_window:
            self._recent_ids.popitem(last=False)
        heapq.heappush(self._by_version, (min_version, seq))
        heapq.heappush(self._by_freshness, (-min_version, seq))
        self._tokens += num_tokens
        self._policy_tokens += group.policy_tokens
        self._bytes += entry.nbytes
        self._ingested += 1

    def _remove(self, seq: int, reason: str) -> None:
        entry = self._entries.pop(seq)
        gid = entry.group.group_id
        del self._seq_of[gid]
        self._tokens -= entry.num_tokens
        self._policy_tokens -= entry.group.policy_tokens
        self._bytes -= entry.nbytes
        if reason == "consumed":
            self._retired += 1
        else:
            self._dropped[reason] += 1
            if entry.uses == 0:  # a group trained on and then evicted was not wasted
                self._tokens_by_fate[reason] += entry.group.policy_tokens
        limit = 2 * len(self._entries) + 64
        if len(self._by_version) > limit or len(self._by_freshness) > limit:
            self._rebuild_heaps()
        if self._on_remove is not None:
            self._on_remove(gid, reason)

    def _rebuild_heaps(self) -> None:
        self._by_version = [(e.min_version, s) for s, e in self._entries.items()]
        self._by_freshness = [(-e.min_version, s) for s, e in self._entries.items()]
        heapq.heapify(self._by_version)
        heapq.heapify(self._by_freshness)

    # ------------------------------------------------------------------ eviction and sampling

    def evict_stale(self) -> int:
        """Drop every group whose staleness now exceeds ``max_staleness``; return how many."""
        oldest_ok = self._versions.current_version() - self._policy.max_staleness
        evicted = 0
        while self._by_version and self._by_version[0][0] < oldest_ok:
            _, seq = heapq.heappop(self._by_version)
            if seq in self._entries:
                self._remove(seq, "stale")
                evicted += 1
        return evicted

    def evict_off_timeline(self) -> int:
        """Drop every group sampled from weights no longer on the learner's timeline (call
        when the learner's epoch rose; O(n)); return how many."""
        dead = [
            seq
            for seq, e in self._entries.items()
            if not self._versions.on_timeline(e.group.weights_epoch, e.group.max_version)
        ]
        for seq in dead:
            self._remove(seq, "dead_timeline")
        return len(dead)

    def take(self, k: int, floor: int | None = None) -> list[G]:
        """Up to ``k`` distinct groups with ``min_version >= floor``, in the policy's order.

        Stale groups are evicted first. ``fifo``: oldest accepted first; ``freshest``: highest
        ``min_version`` first, ties oldest first; ``random``: uniform without replacement from
        the seeded generator. A group leaves the store on its ``max_reuse``-th return.
        """
        if k <= 0:
            return []
        self.evict_stale()
        match self._policy.sampling:
            case "fifo":
                picked = self._pick_fifo(k, floor)
            case "freshest":
                picked = self._pick_freshest(k, floor)
            case "random":
                picked = self._pick_random(k, floor)
        out = []
        for seq in picked:
            entry = self._entries[seq]
            entry.uses += 1
            if entry.uses == 1:
                self._tokens_by_fate["trained"] += entry.group.policy_tokens
            out.append(entry.group)
            if entry.uses >= self._policy.max_reuse:
                self._remove(seq, "consumed")
        self._consumed += len(out)
        return out

    def peek(self, k: int, floor: int | None = None) -> list[G]:
        """The groups ``take(k, floor)`` would return next, in its order, without taking them
        (``random``: the oldest eligible; the take then draws its own). Evicts stale groups
        first, as ``take`` does. Costs what a ``take`` costs."""
        if k <= 0:
            return []
        self.evict_stale()
        if self._policy.sampling == "freshest":
            picked = self._pick_freshest(k, floor)
        else:
            picked = self._pick_fifo(k, floor)
        return [self._entries[seq].group for seq in picked]

    def _pick_fifo(self, k: int, floor: int | None) -> list[int]:
        picked = []
        for seq, entry in self._entries.items():
            if floor is None or entry.min_version >= floor:
                picked.append(seq)
                if len(picked) == k:
                    break
        return picked

    def _pick_freshest(self, k: int, floor: int | None) -> list[int]:
        picked: list[int] = []
        heap = self._by_freshness
        while heap and len(picked) < k:
            neg_version, seq = heap[0]
            if floor is not None and -neg_version < floor:
                break  # everything below the top is older still
            heapq.heappop(heap)
            if seq in self._entries:
                picked.append(seq)
        # Put the picked ones back: those used up by take() turn into dead items lazily.
        for seq in picked:
            heapq.heappush(heap, (-self._entries[seq].min_version, seq))
        return picked

    def _pick_random(self, k: int, floor: int | None) -> list[int]:
        eligible = [
            seq
            for seq, entry in self._entries.items()
            if floor is None or entry.min_version >= floor
        ]
        return self._rng.sample(eligible, min(k, len(eligible)))

    # ------------------------------------------------------------------ live configuration

    def reconfigure(self, **changes: Any) -> dict[str, tuple[Any, Any]]:
        """Change policy knobs at run time: all or nothing.

        Every key and value is validated before anything changes (``ValueError`` naming the
        first bad key). ``None`` is a value here (``capacity_tokens=None`` lifts that bound);
        callers translating a ``Reconfigure`` message drop its ``None`` fields first.
        Shrinking ``capacity``/``capacity_tokens`` evicts oldest-first (counted
        ``"capacity"``); lowering ``max_reuse`` retires groups already used that often; a
        lower ``max_staleness`` applies at the next ``take``/``evict_stale``. Returns
        ``{key: (old, new)}`` for the keys whose value changed.
        """
        for name, value in changes.items():
            check_policy_value(name, value)
        old = self._policy
        new = dataclasses.replace(old, **changes)
        self._policy = new
        cap_tokens = new.capacity_tokens
        while len(self._entries) > new.capacity or (
            cap_tokens is not None and self._tokens > cap_tokens
        ):
            self._remove(next(iter(self._entries)), "capacity")
        if new.max_reuse < old.max_reuse:
            used_up = [s for s, e in self._entries.items() if e.uses >= new.max_reuse]
            for seq in used_up:
                self._remove(seq, "consumed")
        return {
            name: (getattr(old, name), getattr(new, name))
            for name in changes
            if getattr(old, name) != getattr(new, name)
        }

    # ------------------------------------------------------------------ introspection

    def stats(self) -> dict[str, Any]:
        """Counters since construction plus the current contents.

        ``consumed`` counts returns (a group reused twice counts twice); ``retired`` counts
        groups that left after their last use; ``bytes`` is ``group.nbytes`` summed over
        stored groups; ``staleness_hist`` maps staleness against the current version to the
        number of stored groups.
        """
        version = self._versions.current_version()
        hist = Counter(version - e.min_version for e in self._entries.values())
        return {
            "size": len(self._entries),
            "capacity": self._policy.capacity,
            "tokens": self._tokens,
            "capacity_tokens": self._policy.capacity_tokens,
            "offered": self._offered,
            "ingested": self._ingested,
            "consumed": self._consumed,
            "retired": self._retired,
            "refused_full": self._refused_full,
            "dropped": dict(self._dropped),
            "tokens_by_fate": dict(self._tokens_by_fate),
            "stored_policy_tokens": self._policy_tokens,
            "bytes": self._bytes,
            "staleness_hist": dict(sorted(hist.items())),
        }

    def pending(self) -> list[G]:
        """Every stored group, oldest accepted first (for checkpoints and recovery checks)."""
        return [e.group for e in self._entries.values()]
