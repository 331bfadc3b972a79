"""The launchers' watchdog (``pipelines.ops.watchdog``) and ``serve``'s heartbeat that it watches.

The watch is pure logic over the job's counters and a clock: tested here with a hand-driven clock.
The end-to-end cases (a frozen and a killed SDK worker on the real Prism) are in
``test_serve_faults.py`` and ``test_events_stream.py``.
"""

from __future__ import annotations

from ratebeam.pipelines.ops.heartbeat import HEARTBEAT_S
from ratebeam.pipelines.ops.watchdog import StallWatch
from ratebeam.pipelines.serve import ServeOptions, heartbeat_s, heartbeats_in_all


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_counter_that_stays_the_same_for_the_timeout_is_stalled_and_one_that_moves_is_not():
    clock = Clock()
    watch = StallWatch("heartbeats", 30, clock=clock)
    assert not watch.stalled({"heartbeats": 1})
    clock.now += 29
    assert not watch.stalled({"heartbeats": 1})
    clock.now += 2
    assert not watch.stalled({"heartbeats": 2})  # moved: 31 s after the first value, 0 s after this one
    clock.now += 29.9
    assert not watch.stalled({"heartbeats": 2})
    clock.now += 0.1
    assert watch.stalled({"heartbeats": 2, "cycles": 7})  # other counters do not count
    assert "ratebeam_heartbeats has not moved for 30s: the job is stuck" in watch.explain()


def test_a_step_is_stalled_only_when_it_stays_behind_its_input_for_the_timeout():
    clock = Clock()
    watch = StallWatch("scope_batches_applied", 10, behind="scope_batches_emitted", clock=clock)
    assert not watch.stalled({"source_polls": 9})  # nothing emitted yet
    clock.now += 100
    assert not watch.stalled({"scope_batches_emitted": 3, "scope_batches_applied": 3})  # caught up for long
    clock.now += 100
    assert not watch.stalled({"scope_batches_emitted": 4, "scope_batches_applied": 3})  # behind since now
    clock.now += 9
    assert not watch.stalled({"scope_batches_emitted": 5, "scope_batches_applied": 3})
    clock.now += 1
    assert watch.stalled({"scope_batches_emitted": 5, "scope_batches_applied": 3})
    assert "while ratebeam_scope_batches_emitted is ahead of it" in watch.explain()
    first = StallWatch("scope_batches_applied", 10, behind="scope_batches_emitted", clock=clock)
    assert not first.stalled({"scope_batches_emitted": 1})  # the step never counted one: 0 applied
    clock.now += 10
    assert first.stalled({"scope_batches_emitted": 1})


def test_a_runner_that_reports_no_counters_is_not_watched():
    clock = Clock()
    watch = StallWatch("source_polls", 10, clock=clock)
    for _ in range(5):
        clock.now += 60
        assert not watch.stalled({})
        assert not watch.stalled({"notifications_received": 3})


def test_a_finite_clock_that_fired_its_last_time_is_not_watched_any_more():
    clock = Clock()
    watch = StallWatch("heartbeats", 10, done_at=6, clock=clock)
    watch.stalled({"heartbeats": 5})
    clock.now += 11
    assert watch.stalled({"heartbeats": 5})
    watch.stalled({"heartbeats": 6})
    clock.now += 1000
    assert not watch.stalled({"heartbeats": 6})  # the job commits its last tick and ends on its own


def test_serves_heartbeat_beats_at_least_every_30_s_and_twice_per_tick():
    for interval in (0.5, 5, 60, 61, 3600, 86_400):
        assert heartbeat_s(interval) <= min(HEARTBEAT_S, interval / 2)
    assert heartbeat_s(3600) == HEARTBEAT_S
    assert heartbeats_in_all(ServeOptions("PortableRunner", interval=5, ticks=5), first=1) == 8  # 20 s, 2.5 s apart
    assert heartbeats_in_all(ServeOptions("PortableRunner", interval=3600), first=0) is None
