"""Progress of a long batch job: periods done / total, points per second, ETA.

A tqdm bar when the stream is a terminal, plain lines otherwise (logs, CI), so a redirected run
still says how far it got.  Self-contained on purpose: one small class that a shared progress
module can replace without touching its callers (``update`` and ``close`` are all they use).
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from typing import TextIO


class Progress:
    """Reports ``done`` of ``total`` periods and the points written, as they grow."""

    def __init__(self, label: str, total: int, stream: TextIO | None = None) -> None:
        self._label = label
        self._total = total
        self._stream = stream or sys.stderr
        self._start = time.monotonic()
        self._done = 0
        self._bar = None
        if self._stream.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=label, unit="period", file=self._stream)

    def update(self, done: int, points: int) -> None:
        """``done`` periods of the total are finished and ``points`` points written so far."""
        elapsed = max(time.monotonic() - self._start, 1e-9)
        rate = points / elapsed
        if self._bar is not None:
            self._bar.update(done - self._done)
            self._bar.set_postfix_str(f"{rate:,.0f} points/s")
        else:
            print(self.line(done, points, elapsed), file=self._stream, flush=True)
        self._done = done

    def line(self, done: int, points: int, elapsed: float) -> str:
        """The plain progress line: ``label: 12/72 periods (16%), 340 points/s, ETA 0:00:35``."""
        share = f"{100 * done // self._total}%" if self._total else "100%"
        eta = "-" if not done else str(timedelta(seconds=round(elapsed * (self._total - done) / done)))
        return (f"{self._label}: {done}/{self._total} periods ({share}), "
                f"{points / max(elapsed, 1e-9):,.0f} points/s, ETA {eta}")

    def close(self) -> None:
        """End the bar (the plain lines need nothing)."""
        if self._bar is not None:
            self._bar.close()
