"""The core board (``streamrl.core_lending``): a working role process runs on its own threads
plus its share of the waiting ones', within the host's cores, and gives them back when the
lender works again. Several views of one board file stand for the role processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamrl.config import load_config
from streamrl.controller.placement import core_board
from streamrl.controller.specs import SpecFactory
from streamrl.core_lending import SLOTS, CoreBoard, board_slot, create_board, open_board


class Threads:
    """Records what a view would pass to torch.set_num_threads."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, n: int) -> None:
        self.calls.append(n)


@pytest.fixture
def board(tmp_path: Path) -> str:
    path = tmp_path / "cores.board"
    create_board(path)
    return str(path)


def test_a_waiting_learner_lends_its_core_to_the_generator(board: str) -> None:
    gen_threads = Threads()
    learner = CoreBoard(board, 0, 1, 2, Threads())
    generator = CoreBoard(board, 1, 1, 2, gen_threads)
    assert generator.threads() == 1
    with learner.waiting():
        generator.adjust()  # a decode step's look at the board
        assert generator.current == 2
        generator.adjust()  # unchanged: no second call
    # The learner works again: the generator's next look gives the core back.
    generator.adjust()
    assert gen_threads.calls == [2, 1]
    assert generator.borrowed_s() > 0.0
    learner.close()
    generator.close()


def test_lent_threads_are_shared_among_the_working_within_the_host(board: str) -> None:
    # 8 cores: 4 learner ranks and 4 generators, one thread each.
    views = [CoreBoard(board, s, 1, 8, Threads()) for s in range(8)]
    learners, generators = views[:4], views[4:]
    for g in generators:
        g._map[g.slot * 2 + 1] = 1  # every generator waits for admission
    assert [v.threads() for v in learners] == [2, 2, 2, 2]  # 4 lent threads, 4 borrowers
    generators[0]._map[generators[0].slot * 2 + 1] = 0  # one generator works again
    # 3 lent among 5 working processes: one each to the first three.
    assert [v.threads() for v in learners] == [2, 2, 2, 1]
    assert generators[0].threads() == 1


def test_threads_never_exceed_the_host(board: str) -> None:
    # Sync mode on 2 cores: each side already runs 2 threads, nothing more to take.
    learner = CoreBoard(board, 0, 2, 2, Threads())
    generator = CoreBoard(board, 1, 2, 2, Threads())
    with learner.waiting():
        assert generator.threads() == 2


def test_a_view_that_only_lends_never_changes_its_threads(board: str) -> None:
    learner = CoreBoard(board, 0, 1, 2, Threads())
    fixed = CoreBoard(board, 1, 1, 2, None)  # e.g. a vLLM generator
    with learner.waiting():
        fixed.adjust()
    assert fixed.current == 1
    with fixed.waiting():  # it still lends
        assert learner.threads() == 2


def test_a_closed_slot_lends_nothing(board: str) -> None:
    learner = CoreBoard(board, 0, 1, 2, Threads())
    generator = CoreBoard(board, 1, 1, 2, Threads())
    generator._map[generator.slot * 2 + 1] = 1
    generator.close()
    assert learner.threads() == 1


def test_slots_and_who_gets_a_board(tmp_path: Path) -> None:
    assert board_slot("learner", 1, 2) == 1
    assert board_slot("generator", 0, 2) == 2
    assert board_slot("generator", SLOTS, 2) is None
    assert open_board(None, None, 1, 2, Threads()) is None
    config = load_config(None, ["model.name=tiny-random-llama"])
    path = core_board(config, None, tmp_path, pinned=False)
    assert path is not None and Path(path).stat().st_size == SLOTS * 2
    assert core_board(config, "10.0.0.1:6379", tmp_path, pinned=False) is None  # a cluster
    assert core_board(config, None, tmp_path, pinned=True) is None
    off = load_config(None, ["model.name=tiny-random-llama", "placement.lend_idle_cores=false"])
    assert core_board(off, None, tmp_path, pinned=False) is None
    specs = SpecFactory(config, tmp_path, "model", "127.0.0.1", core_board=path)
    generator = specs.generator(3, incarnation=0)
    assert (generator.core_board, generator.core_slot) == (path, config.learner.count + 3)
    assert SpecFactory(config, tmp_path, "model", "127.0.0.1").generator(0, 0).core_board is None
