"""A process named by its identity, pid plus start time, never by a bare pid.

The OS reuses pids: a role replaced hours ago has a pid that may now belong to someone else's
editor or shell. So the controller records, with each role's pid, the kernel's start time of
that process (``/proc/<pid>/stat`` field 22, clock ticks since boot), and signals a pid only
while the process holding it started at that same tick. A process whose start time cannot be
read (it had already exited when its pid was learned, or there is no ``/proc``) has no
identity: it is never signalled.

The signal goes through a pidfd where the kernel has them (Linux >= 5.3): the pidfd is opened
first, then the start time checked, so the process checked is the process signalled even if
the pid is reused in between. Without pidfds a plain ``os.kill`` follows the check, with a
window of microseconds.

Stdlib only. Identities are read on the controller's host: they mean something in local mode,
where every role runs there (the only mode that reaps; a cluster's roles are Ray's to end).

Example::

    me = ProcessIdentity.of(os.getpid())   # ProcessIdentity(pid=4242, start_ticks=183521)
    me.running()                            # True
    ProcessIdentity(4242, 1).running()      # False: pid 4242 is not the process started at 1
    ProcessIdentity(4242, 1).send(signal.SIGKILL)   # False, nothing signalled
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot; None: no such process here."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # Field 2 (the command) is in parentheses and may hold spaces or ')': count after the last.
    fields = stat[stat.rindex(b")") + 2 :].split()
    return int(fields[19])  # fields[0] is field 3 (state); field 22 is starttime


@dataclass(frozen=True, order=True)
class ProcessIdentity:
    pid: int
    start_ticks: int

    @classmethod
    def of(cls, pid: int) -> ProcessIdentity | None:
        """The identity of the process that holds ``pid`` now (None: none, or no ``/proc``)."""
        ticks = start_ticks(pid)
        return None if ticks is None else cls(pid, ticks)

    def running(self) -> bool:
        """Whether this very process still exists (a zombie counts until it is waited for)."""
        return start_ticks(self.pid) == self.start_ticks

    def send(self, sig: signal.Signals) -> bool:
        """Signal this process if it is still the one holding its pid; whether it was sent."""
        pidfd = None
        with contextlib.suppress(AttributeError, OSError):  # no pidfds, or already gone
            pidfd = os.pidfd_open(self.pid)
        try:
            if not self.running():
                return False
            if pidfd is not None:
                signal.pidfd_send_signal(pidfd, sig)
            else:
                os.kill(self.pid, sig)
            return True
        except ProcessLookupError:
            return False
        finally:
            if pidfd is not None:
                os.close(pidfd)
