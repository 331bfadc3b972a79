"""Progress of long work: a bar on a terminal, a plain line now and then otherwise.

``with progress(total, "period", desc="rating") as bar: bar.advance()`` — the one API of every
long command (``run`` today, a backfill or an export later).  On a terminal it draws a tqdm bar on
stderr (log lines are routed above it, so they do not tear it); elsewhere (a pipe, a file, a
scheduler's log) a bar's carriage returns would be noise, so it writes a plain line at most every
``interval`` seconds and a last one when the work is done.  The total may grow as the work is
discovered (``add_total``: a run learns its periods scope by scope) and may be set at the end from
exact figures (``set``).  Updates may come from worker threads: they are serialised.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import timedelta
from typing import TextIO

#: Seconds between two plain progress lines (not a terminal).
PLAIN_INTERVAL = 10.0


class Progress:
    """Counts done and total units and shows them (a tqdm bar, or plain lines)."""

    def __init__(self, total: int | None, unit: str, desc: str, stream: TextIO, *, bar: bool,
                 interval: float = PLAIN_INTERVAL) -> None:
        self.done = 0
        self.total = total
        self.points: int | None = None  # points written so far, when the work counts them
        self._unit = unit
        self._desc = desc
        self._stream = stream
        self._interval = interval
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._shown_at = self._started
        self._bar = None
        if bar:
            from tqdm import tqdm

            self._bar = tqdm(total=total, unit=unit, desc=desc, file=stream, dynamic_ncols=True)

    def advance(self, n: int = 1) -> None:
        """``n`` more units done."""
        with self._lock:
            self.done += n
            self._show(n)

    def add_total(self, n: int) -> None:
        """``n`` more units to do (work found on the way)."""
        with self._lock:
            self.total = (self.total or 0) + n
            if self._bar is not None:
                self._bar.total = self.total
            self._show(0)

    def set(self, done: int, total: int | None, *, points: int | None = None) -> None:
        """The exact figures (e.g. a pipeline's counters once it finished; ``points`` written so far)."""
        with self._lock:
            step, self.done, self.total = done - self.done, done, total
            if points is not None:
                self.points = points
            if self._bar is not None:
                self._bar.total = total
                if points is not None:
                    self._bar.set_postfix_str(f"{self._rate():,.0f} points/s", refresh=False)
            self._show(step)

    def close(self, *, finished: bool) -> None:
        """End the bar; a plain last line only when the work ``finished`` (an error says the rest)."""
        if self._bar is not None:
            self._bar.close()
        elif finished:
            self._line(f" in {time.monotonic() - self._started:.1f} s")

    def _show(self, step: int) -> None:
        if self._bar is not None:
            self._bar.update(step) if step else self._bar.refresh()
            return
        now = time.monotonic()
        if now - self._shown_at >= self._interval:
            self._shown_at = now
            self._line("")

    def _rate(self) -> float:
        return (self.points or 0) / max(time.monotonic() - self._started, 1e-9)

    def _line(self, suffix: str) -> None:
        """``desc: 12/72 period(s)``; work that counts its points adds the share, points/s and ETA."""
        total = "?" if self.total is None else str(self.total)
        line = f"{self._desc}: {self.done}/{total} {self._unit}(s)"
        if self.points is not None and self.total:
            line += f" ({100 * self.done // self.total}%), {self._rate():,.0f} points/s"
            if not suffix:
                elapsed = time.monotonic() - self._started
                left = round(elapsed * (self.total - self.done) / self.done) if self.done else None
                line += f", ETA {'-' if left is None else timedelta(seconds=left)}"
        print(line + suffix, file=self._stream, flush=True)


@contextmanager
def progress(total: int | None, unit: str, *, desc: str, stream: TextIO | None = None,
             interval: float = PLAIN_INTERVAL) -> Iterator[Progress]:
    """A :class:`Progress` on ``stream`` (stderr): a bar when it is a terminal, plain lines otherwise."""
    stream = stream or sys.stderr
    bar = stream.isatty()
    with ExitStack() as stack:
        if bar:
            stack.enter_context(_logs_above_bar())
        shown = Progress(total, unit, desc, stream, bar=bar, interval=interval)
        try:
            yield shown
        except BaseException:
            shown.close(finished=False)
            raise
        shown.close(finished=True)


class _AboveBar(logging.Handler):
    """A console handler's lines written with ``tqdm.write`` (above the bar), at its level and format.

    tqdm's own ``logging_redirect_tqdm`` drops the handler's level, which would show INFO lines
    the user's ``--log-level`` hides.
    """

    def __init__(self, console: logging.StreamHandler) -> None:
        super().__init__(console.level)
        self.setFormatter(console.formatter)
        self._stream = console.stream

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm

        try:
            tqdm.write(self.format(record), file=self._stream)
        except Exception:  # logging's contract: a handler reports its own failure, never raises
            self.handleError(record)


@contextmanager
def _logs_above_bar() -> Iterator[None]:
    """Route the root logger's console handlers through ``tqdm.write`` while a bar is drawn."""
    root = logging.getLogger()
    original = root.handlers
    root.handlers = [_AboveBar(h) if isinstance(h, logging.StreamHandler) and h.stream in (sys.stdout, sys.stderr)
                     else h for h in original]
    try:
        yield
    finally:
        root.handlers = original
