"""A tick of ``serve`` closes its window, so commits, as soon as its own work is done.

``CommitState`` groups a tick's outcomes in the tick's window, and the group fires when the
watermark passes the window's end.  The window ends at the instant the impulse fired the tick, the
watermark the impulse sets as it fires (``pipelines.ticks``), so no later firing is waited for.
Before, the window ended just after the tick and a pulse half an interval later closed it; in CI,
on a starved CPU, Prism once moved nothing at the pulse, the tick committed only with the next
tick, and that tick skipped the scopes the first still leased.

The test runs ``serve``'s own tick clock (simulated time, 2 ticks 30 s apart) on the real Prism job
server of the test setup into a ``GroupByKey`` per tick window, as ``CommitState`` groups, and
notes on the wall clock when each tick was seen and when its group fired: each group holds its own
tick and fires long before the pulse would have come (half an interval).  The old clock fails it:
its group fired at the pulse.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from servers.prism import prism_endpoint  # noqa: F401  (session fixture)

from ratebeam.pipelines.ticks import TickClock, tick_clock

T0 = datetime(2026, 1, 1, tzinfo=UTC)
STEP = 3600
TICKS = 2
INTERVAL = 30.0


class _Note(beam.DoFn):
    """Appends ``[what, tick, wall time]`` to a file for each tick it sees."""

    def __init__(self, out: str, what: str) -> None:
        self._out, self._what = out, what

    def process(self, element: tuple[str, Iterable[datetime]] | datetime) -> Iterator[tuple[str, datetime]]:
        ticks = list(element[1]) if isinstance(element, tuple) else [element]
        with open(self._out, "a") as notes:
            notes.write(json.dumps([self._what, [tick.isoformat() for tick in ticks], time.time()]) + "\n")
        if not isinstance(element, tuple):
            yield "scope", element


def test_a_ticks_window_closes_once_its_work_is_done_without_waiting_for_a_later_firing(
        prism_endpoint: str, tmp_path: Path) -> None:  # noqa: F811
    notes = tmp_path / "notes.jsonl"
    flags = ["--runner=PortableRunner", f"--job_endpoint={prism_endpoint}", "--environment_type=LOOPBACK", "--streaming"]
    with beam.Pipeline(options=PipelineOptions(flags)) as pipeline:
        (tick_clock(pipeline, TickClock(T0, STEP), INTERVAL, range(TICKS), time.time())
         | "Seen" >> beam.ParDo(_Note(str(notes), "seen"))
         | beam.GroupByKey()
         | "Fired" >> beam.ParDo(_Note(str(notes), "fired")))

    lines = [json.loads(line) for line in notes.read_text().splitlines()]
    seen = {ticks[0]: at for what, ticks, at in lines if what == "seen"}
    fired = {tuple(ticks): at for what, ticks, at in lines if what == "fired"}
    expected = [datetime.fromtimestamp(T0.timestamp() + k * STEP, UTC).isoformat() for k in range(TICKS)]
    assert sorted(seen) == expected
    assert sorted(fired) == [(tick,) for tick in expected]  # one group per tick, holding that tick only
    for tick in expected:
        assert fired[(tick,)] - seen[tick] < INTERVAL / 2, (tick, lines)
