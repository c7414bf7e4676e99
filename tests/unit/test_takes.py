"""LastTakes: which batch requests are repeats of a client's last take."""

from __future__ import annotations

from streamrl.buffers.takes import LastTakes


def test_a_repeat_gets_the_same_items_an_older_request_none_a_newer_one_is_new():
    takes: LastTakes[str] = LastTakes()
    assert takes.answer("a", 1) is None
    takes.put("a", 5, ["g1", "g2"])
    assert takes.answer("a", 5) == ["g1", "g2"]
    assert takes.answer("a", 4) == []
    assert takes.answer("a", 6) is None
    assert takes.answer("b", 5) is None  # another client's ids are its own


def test_replay_extends_one_take_and_starts_the_next():
    takes: LastTakes[str] = LastTakes()
    takes.extend("a", 1, ["g1"])
    takes.extend("a", 1, ["g2"])
    assert takes.answer("a", 1) == ["g1", "g2"]
    takes.extend("a", 2, ["g3"])
    assert takes.answer("a", 2) == ["g3"] and takes.answer("a", 1) == []


def test_the_least_recently_taking_client_is_forgotten_first():
    takes: LastTakes[str] = LastTakes(max_clients=2)
    takes.put("a", 1, ["g1"])
    takes.put("b", 1, ["g2"])
    takes.put("a", 2, ["g3"])  # a took again: b is now the oldest
    takes.put("c", 1, ["g4"])
    assert [client for client, _ in takes.items()] == ["a", "c"]
    assert takes.answer("b", 1) is None
