"""The exit statuses of every ``ratebeam`` command, in one place so scripts can rely on them.

* ``EXIT_OK`` (0): everything asked was done.
* ``EXIT_FAILED`` (1): the command ran but some frames failed (``run``: they are in the dead-letter
  table and are rated again by a later run) or a connector refused the work.
* ``EXIT_GAPS`` (1, the same number): ``gaps`` found at least one cell collected empty, failed or
  not yet rated (0: no gap in the window), so a monitoring check can alert on the status alone.
* ``EXIT_BAD_INPUT`` (2): bad input found before any work (a wrong file, key or value, an unknown
  scope, a backend that cannot do what was asked; nothing was changed), or a fatal connector error
  (authentication, TLS, unknown database or index) that stopped the run at once, in one line.
* ``EXIT_FRAME_FAILED`` (3): ``rate`` priced the file but some frames failed; their points carry
  ``"price": null`` and the error.
* ``EXIT_INTERNAL`` (70, ``EX_SOFTWARE`` of sysexits.h): an error ratebeam did not expect, a bug;
  stderr says ``ratebeam: internal error: ...`` in one line (``-v`` adds the traceback).  Bad input
  never gets this status: each reader names the file, key and value with status 2.
* ``EXIT_BROKEN_PIPE`` (141, as a process killed by SIGPIPE): the reader of stdout stopped reading
  (``ratebeam report ... | head``); nothing is printed on stderr.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_GAPS = 1
EXIT_BAD_INPUT = 2
EXIT_FRAME_FAILED = 3
EXIT_INTERNAL = 70
EXIT_BROKEN_PIPE = 141
