"""Prism's dynamic splits and a stateful step: the fault ``prism_disable_sdf_split`` works around.

Prism 2.75 split a bundle whose input made no progress between two progress ticks (100 ms at
first), and splitting a stateful stage's bundle released every key of the residual from the stage's
in-progress keys (``engine/elementmanager.go``, ``splitBundle``), even when the primary still held
elements of that key: the residual then ran as a second bundle of the same key beside the primary,
from a copy of the state taken before the primary's writes, and whichever persisted last won.  The
event stream's scope step is such a stage; on a starved CPU each of its elements could take longer
than a tick, and a scope lost a bundle's events.  Prism 2.78, the version ratebeam runs
(``PRISM_VERSION``), keeps a key held while the primary still carries it.

Both tests run the same slow stateful step (one key, 12 elements, 0.3 s each) on the real Prism
job server of the test setup: with the flags ``events serve`` gives its job, the key keeps all 12;
without the experiment too — the fix of the Prism ratebeam pins.  On Prism 2.75 the second test
failed every time (3 of 3 runs kept 6 of the 12); the experiment stays in ``events serve`` for a
Prism endpoint older than 2.78.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apache_beam as beam
from apache_beam import coders
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import userstate
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.window import GlobalWindow
from servers.prism import prism_endpoint  # noqa: F401  (session fixture)

from ratebeam.pipelines.events.serve import NO_DYNAMIC_SPLITS, EventsServeOptions, job_flags

ELEMENTS = 12


class _Keep(beam.DoFn):
    """Appends each element of its key to one state cell (slower than a progress tick); writes the cell at the end."""

    KEPT = userstate.ReadModifyWriteStateSpec("kept", coders.PickleCoder())
    END = userstate.TimerSpec("end", TimeDomain.WATERMARK)

    def __init__(self, out: str) -> None:
        self._out = out

    def process(self, element: tuple[str, int],
                kept: Any = beam.DoFn.StateParam(KEPT),  # noqa: B008  (Beam's parameter markers)
                end: Any = beam.DoFn.TimerParam(END),  # noqa: B008
                ) -> None:
        time.sleep(0.3)
        kept.write([*(kept.read() or []), element[1]])
        end.set(GlobalWindow().max_timestamp())

    @userstate.on_timer(END)
    def on_end(self, kept: Any = beam.DoFn.StateParam(KEPT)) -> Iterator[int]:  # noqa: B008
        with open(self._out, "a") as out:
            out.write(json.dumps(sorted(kept.read() or [])) + "\n")
        yield 0


def kept_on_prism(flags: list[str], out: Path) -> list[list[int]]:
    """Run the slow stateful step; what its one key held at the end (one list per firing)."""
    with beam.Pipeline(options=PipelineOptions(flags)) as pipeline:
        (pipeline | beam.Create([("scope", i) for i in range(ELEMENTS)]) | beam.Reshuffle()
         | beam.ParDo(_Keep(str(out))))
    return [json.loads(line) for line in out.read_text().splitlines()]


def prism_flags(endpoint: str) -> list[str]:
    return ["--runner=PortableRunner", f"--job_endpoint={endpoint}", "--environment_type=LOOPBACK"]


def test_the_event_streams_flags_keep_every_element_of_a_slow_key(prism_endpoint: str, tmp_path: Path) -> None:  # noqa: F811
    flags = job_flags(EventsServeOptions(runner="PortableRunner", extra_options=tuple(prism_flags(prism_endpoint)[1:])))
    assert NO_DYNAMIC_SPLITS in flags
    assert kept_on_prism(flags, tmp_path / "kept.jsonl") == [list(range(ELEMENTS))]


def test_without_the_experiment_ratebeams_prism_keeps_every_element_too(prism_endpoint: str, tmp_path: Path) -> None:  # noqa: F811
    assert kept_on_prism(prism_flags(prism_endpoint), tmp_path / "kept.jsonl") == [list(range(ELEMENTS))]
