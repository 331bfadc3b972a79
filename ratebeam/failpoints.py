"""Named crash points for the crash-safety tests: ``RATEBEAM_FAILPOINT=<name>:<n>``.

When the variable names a point, the process kills itself with SIGKILL the ``n``-th time it
reaches that point — a real, uncatchable crash at a chosen place (during collection, between two
writes, before the state commit), so tests can prove a rerun yields exactly the clean result.
Unset (always, outside tests), a failpoint costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import threading

_ENV = "RATEBEAM_FAILPOINT"
_lock = threading.Lock()
_hits: dict[str, int] = {}


def failpoint(name: str) -> None:
    """Crash here if ``RATEBEAM_FAILPOINT`` says so (see the module docstring)."""
    spec = os.environ.get(_ENV)
    if not spec:
        return
    target, _, count = spec.partition(":")
    if target != name:
        return
    with _lock:
        _hits[name] = _hits.get(name, 0) + 1
        reached = _hits[name] >= int(count or 1)
    if reached:
        os.kill(os.getpid(), signal.SIGKILL)
