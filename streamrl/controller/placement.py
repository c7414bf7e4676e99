"""Ray and cores: how Ray starts or is joined, where roles go, how many threads each gets.

Local mode (no ``--address``): an embedded Ray bound to 127.0.0.1 and every role's sockets on
loopback. Cluster mode: join the cluster; roles bind their node's address; GPU roles get a
placement group per role (learners packed, generators spread).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from streamrl.config import Config
from streamrl.controller.rundir import RunError

# Threads per role are ``streamrl.cores``' (the workers read them too); the controller takes
# them from here with the rest of its placement.


def check_port_free(host: str, port: int, what: str) -> None:
    """Fail before anything starts when a fixed port is taken (port 0 means any free one)."""
    if port == 0:
        return
    import socket

    try:
        with socket.create_server((host, port)):
            pass
    except OSError as exc:
        raise RunError(f"cannot bind the {what} to {host}:{port}: {exc.strerror}") from None


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail in seconds, not after Ray's minute of retries, when nothing listens there."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return  # "auto" and other forms are Ray's to resolve
    import socket

    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise RunError(f"cannot reach the Ray cluster at {address}: {exc}") from None


def init_ray(address: str | None) -> None:
    """Embedded loopback-only Ray by default; ``address`` joins an existing cluster."""
    # Keeps Ray's node on loopback (Ray otherwise binds the host's routable address).
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    kwargs: dict[str, Any] = dict(
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.WARNING,
        namespace="streamrl",
    )
    if address is None:
        # "local": always a fresh embedded instance. Without it ray.init joins any cluster
        # `ray start` left running on this machine (and refuses num_cpus there).
        kwargs.update(address="local", num_cpus=os.cpu_count() or 2, _node_ip_address="127.0.0.1")
        # Ray starts its workers at nice 15 by default; ours start at 0, on a par with the
        # controller, so that each role's side threads stay ahead of its compute threads
        # (which go to +10: streamrl.cores.favour_side_threads). A cluster's own setting holds
        # under --address (there compute goes from 15 to 19).
        kwargs["_system_config"] = {"worker_niceness": 0}
    else:
        _check_reachable(address)
        kwargs["address"] = address
        if address.split(":")[0] in ("127.0.0.1", "localhost"):
            kwargs["_node_ip_address"] = "127.0.0.1"  # a loopback head: stay on loopback
    try:
        ray.init(**kwargs)
    except ConnectionError as exc:
        raise RunError(f"cannot reach the Ray cluster at {address}: {exc}") from None


class Placement:
    """Ray actor options per role; GPU placement groups are created on first use."""

    def __init__(self, config: Config, address: str | None) -> None:
        self.config, self.address = config, address
        self._groups: dict[str, Any] = {}
        # Placement groups keep the counts the run started with (generator.count is live).
        self._counts = {"learner": config.learner.count, "generator": config.generator.count}

    def options(self, role: str, index: int) -> dict[str, Any]:
        """Ray options for one actor: its GPU bundle if it has one. GPU roles get one placement
        group per role, sized at the start (learners packed for NCCL, generators spread),
        created on first use; a generator added live beyond it asks Ray for any free GPU."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        options: dict[str, Any] = {}
        gpus = {
            "learner": self.config.learner.gpus,
            "generator": self.config.generator.gpus,
            "scoring": self.config.scoring.gpus_per_role,
        }
        count = self._counts
        if gpus.get(role, 0) <= 0:
            return options
        if role == "scoring" or index >= count[role]:  # reward roles: any free GPU
            return {"num_gpus": gpus[role]}
        if role not in self._groups:
            from ray.util.placement_group import placement_group

            strategy = "PACK" if role == "learner" else "SPREAD"
            group = placement_group([{"GPU": gpus[role], "CPU": 1}] * count[role], strategy)
            import ray

            try:
                ray.get(group.ready(), timeout=120)
            except ray.exceptions.GetTimeoutError:
                raise RunError(
                    f"cannot place {count[role]} {role}(s) with {gpus[role]} GPU each: "
                    "not enough GPUs in the cluster"
                ) from None
            self._groups[role] = group
        options.update(
            num_gpus=gpus[role],
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=self._groups[role], placement_group_bundle_index=index
            ),
        )
        return options


def _share(pool: list[int], members: int) -> list[list[int]]:
    """Split ``pool`` into ``members`` contiguous core sets; with fewer cores than members,
    every member shares the whole pool."""
    if members <= 0:
        return []
    if len(pool) < members:
        return [list(pool) for _ in range(members)]
    size = len(pool) // members
    return [pool[i * size : (i + 1) * size] for i in range(members)]


def cpu_split(config: Config, available: list[int]) -> dict[str, list[list[int]]]:
    """Core sets per CPU role instance under ``placement.pin_cpus``: learner ranks get the
    first ``placement.learner_cores`` cores (default half), generators the rest. Roles on a GPU
    are placed per device instead and get no entry. Empty when pinning is off."""
    if not config.placement.pin_cpus:
        return {}
    cpu_roles = {
        "learner": config.learner.count if config.learner.device == "cpu" else 0,
        "generator": config.generator.count if config.generator.device == "cpu" else 0,
    }
    cores = sorted(available)
    if cpu_roles["learner"] and cpu_roles["generator"]:
        if len(cores) < 2:
            raise RunError(
                f"placement.pin_cpus needs at least 2 cores for disjoint learner and generator "
                f"pools; this process may use {len(cores)}"
            )
        k = config.placement.learner_cores or max(1, len(cores) // 2)
        if k >= len(cores):
            raise RunError(
                f"placement.learner_cores={k} leaves no core for the generators "
                f"({len(cores)} usable)"
            )
        pools = {"learner": cores[:k], "generator": cores[k:]}
    else:
        pools = {"learner": cores, "generator": cores}
    split = {role: _share(pools[role], n) for role, n in cpu_roles.items() if n}
    if config.scoring.device == "cpu" and any(r.served for r in config.rewards):
        # Reward roles share one role's pool (``scoring.cores``), all of it each: a scorer is
        # idle between batches, and its batches are short next to a generation call.
        split["scoring"] = [list(pools[config.scoring.cores])]
    return split


def describe_split(split: dict[str, list[list[int]]]) -> str:
    """``learner rank 0: cores [0]; generator 0: cores [1]`` (what the controller prints)."""
    names = {"learner": "learner rank", "generator": "generator", "scoring": "reward roles"}
    return "; ".join(
        f"{names[role]} {i}: cores {sets[i]}"
        for role, sets in split.items()
        for i in range(len(sets))
    )
