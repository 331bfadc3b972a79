"""Who holds a scope lease, and whether that process is provably gone (a killed run's leases).

An owner is ``"<host>:<pid>.<start>.<space>:<run id>"`` (a run's ticks and jobs add ``@...``):
``start`` is the process's start time (``/proc/<pid>/stat`` field 22, clock ticks since boot)
and ``space`` names the kernel boot and PID namespace it runs in (a hash of
``/proc/sys/kernel/random/boot_id`` and ``/proc/self/ns/pid``).  Together they tell, from any
process of the same boot and PID namespace, whether the holder still runs: no process with that
pid, or one that started at another time (the pid was reused), or a zombie, means it is gone.

Why so much: the hostname alone is not the host.  Two containers with ``--net=host`` share the
host's name but not their PIDs, a restarted container reuses its PIDs, and a cloned VM may keep
its name; each would otherwise see a live run as dead.  Whatever cannot be proven gone — another
host or namespace, a foreign owner, an owner written before this format (``<host>:<pid>:<run>``,
no start time), a system without ``/proc`` (owners then keep that old form) — counts as alive: its
lease is waited for until it expires, ``lease_seconds`` after its last heartbeat.
"""

from __future__ import annotations

import hashlib
import os
import socket
from functools import cache
from pathlib import Path

_PROC = Path("/proc")


def make_owner(run_id: str) -> str:
    """The lease owner of run ``run_id`` in this process (see the module docstring for the format)."""
    if not run_id:
        raise ValueError("run id: must not be empty")
    pid = os.getpid()
    start, space = _start_time(pid), _space()
    process = f"{pid}" if start is None or space is None else f"{pid}.{start}.{space}"
    return f"{socket.gethostname()}:{process}:{run_id}"


def owner_gone(owner: str) -> int | None:
    """The pid of ``owner``'s process when it provably no longer runs, else None (alive or unknown)."""
    _host, _, rest = owner.partition("@")[0].partition(":")
    fields = rest.partition(":")[0].split(".")
    if len(fields) != 3 or not (fields[0].isdigit() and fields[1].isdigit()) or fields[2] != _space():
        return None
    pid = int(fields[0])
    try:
        stat = (_PROC / str(pid) / "stat").read_text(encoding="ascii", errors="replace")
    except FileNotFoundError:
        return pid
    except OSError:
        return None
    state, started = _stat_fields(stat)
    return pid if state in ("Z", "X") or started != fields[1] else None


def _stat_fields(stat: str) -> tuple[str, str]:
    """(state, start time) from a ``/proc/<pid>/stat`` line; the name in parentheses may hold spaces."""
    after = stat.rpartition(")")[2].split()  # fields 3 (state) ... 52
    return (after[0], after[19]) if len(after) > 19 else ("", "")


def _start_time(pid: int) -> str | None:
    try:
        started = _stat_fields((_PROC / str(pid) / "stat").read_text(encoding="ascii", errors="replace"))[1]
    except OSError:
        return None
    return started or None


@cache
def _space() -> str | None:
    """The boot and PID namespace of this process, hashed short; None without ``/proc``."""
    try:
        boot = (_PROC / "sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink(_PROC / "self/ns/pid")
    except OSError:
        return None
    return hashlib.sha256(f"{boot} {namespace}".encode()).hexdigest()[:12]
