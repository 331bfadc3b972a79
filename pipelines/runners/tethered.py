"""Runner processes that die with ratebeam, even when ratebeam is killed with SIGKILL.

``runners._serving`` starts Prism and the SDK worker pool in sessions of their own (a Ctrl-C meant
for ratebeam must not reach them before ratebeam stops them), so a SIGKILL of ratebeam, or of its
process group, used to leave them running, holding their ports, for good.  Two ties:

* :func:`dies_with_parent` is the ``preexec_fn`` of a direct child: on Linux it asks the kernel
  (``prctl(PR_SET_PDEATHSIG, SIGKILL)``) to kill the child when the thread that started it ends,
  i.e. when ratebeam dies (``_serving`` keeps its starting thread inside the block the whole time).
* :func:`exit_with_parent` is for the processes the pool starts, which ratebeam does not start: a
  daemon thread that ends the process once its parent is gone (it is then re-parented).  pdeathsig
  cannot serve there: Beam's pool starts each worker from a thread of an unbounded gRPC pool, whose
  idle threads end, and pdeathsig would kill a working worker with them.

Elsewhere than Linux there is no pdeathsig: :func:`dies_with_parent` gives None and a killed
ratebeam's direct children are left running (they are stopped as before on every other exit).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1
#: Seconds between two looks at the parent: how long a pool's worker outlives its pool.
WATCH_SECONDS = 0.5


def dies_with_parent() -> Callable[[], None] | None:
    """A ``subprocess`` ``preexec_fn`` that ties the child's life to this process (Linux), else None.

    The C call is resolved here, before the fork: the child only calls it, and exits at once if
    this process died between the fork and the call (the kernel would not signal it then).
    """
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def tie() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return tie


def exit_with_parent(parent: int) -> threading.Thread:
    """End this process once its parent is not ``parent`` any more; returns the watching thread.

    Checked at once, then every :data:`WATCH_SECONDS`, from a daemon thread.

    ``parent`` comes from whoever started the process (``runners.worker_pool``'s wrapper passes
    the pool's pid, read before this interpreter even started): a pool that died while this
    process was still starting would otherwise be missed, its orphan then watching init.
    """

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(WATCH_SECONDS)
        os._exit(1)  # the parent (the worker pool) died: no one will ask this worker for anything

    thread = threading.Thread(target=watch, name="ratebeam-parent-watch", daemon=True)
    thread.start()
    return thread
