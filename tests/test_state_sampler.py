"""Beam's per-bundle sampling thread is left out where ratebeam's steps run (``pipelines/runners/state_sampler.py``).

Why it matters is measured, not asserted here (no timing in unit tests): Beam's sampler joins a
thread at every bundle's end, and Prism spins a core meanwhile (docs/performance.md).  These tests
check what can be checked without a clock: Beam's sampler starts a thread and the replacement
does not, the replacement still tracks the running step (log records name it), and a pipeline
launched by ratebeam runs its DoFns under the replacement in a worker process of ratebeam's pool
on the real Prism (the launching process keeps Beam's: ``runners.state_sampler``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.worker import statesampler
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.utils.counters import CounterFactory
from servers.prism import prism_endpoint  # noqa: F401  (session fixture)

from ratebeam.pipelines.runners import state_sampler
from ratebeam.pipelines.runners.config import RunnerConfig
from ratebeam.pipelines.runners.launch import launched, worker_pool
from ratebeam.pipelines.runners.state_sampler import BEAM_STATE_SAMPLER, ThreadlessStateSampler


@pytest.fixture
def beams_sampler(monkeypatch) -> Iterator[None]:
    """Beam's own sampler in this process for the test, and whatever was there afterwards."""
    monkeypatch.setattr(statesampler, "StateSampler", BEAM_STATE_SAMPLER)
    yield


def test_beams_sampler_starts_a_thread_per_bundle_and_the_threadless_one_none():
    for sampler_class, new_threads in ((BEAM_STATE_SAMPLER, 1), (ThreadlessStateSampler, 0)):
        sampler = sampler_class("step", CounterFactory())
        before = threading.active_count()
        sampler.start()
        try:
            assert threading.active_count() - before == new_threads, sampler_class
            assert statesampler.get_current_tracker() is sampler
        finally:
            sampler.stop()
        assert statesampler.get_current_tracker() is None
        assert sampler.started and sampler.finished
        sampler.reset()  # the bundle processor's reuse: started again for its next bundle
        assert not sampler.started and not sampler.finished


def _runs_under_threadless_samplers(config: RunnerConfig) -> None:
    """Run a three-element pipeline launched on ``config``; its DoFn ran under the threadless sampler."""
    with launched(config) as launch, beam.Pipeline(launch.runner, options=PipelineOptions(launch.options)) as p:
        # a lambda: pickled by value, so a worker process that cannot import this module runs it
        names = p | beam.Create([1, 2, 3]) | beam.Map(lambda _: type(statesampler.get_current_tracker()).__name__)
        assert_that(names, equal_to(["ThreadlessStateSampler"] * 3))


def test_a_worker_of_ratebeams_pool_runs_its_steps_under_the_threadless_sampler(prism_endpoint, tmp_path,  # noqa: F811
                                                                                 beams_sampler):
    with worker_pool(tmp_path / "pool.log") as pool:
        _runs_under_threadless_samplers(RunnerConfig.model_validate(
            {"runner": "PortableRunner", "prism": {"endpoint": prism_endpoint},
             "environment": {"type": "EXTERNAL", "endpoint": pool}}))


def test_skip_sampling_thread_replaces_beams_class_where_bundle_processors_look_it_up(beams_sampler):
    state_sampler.skip_sampling_thread()
    from apache_beam.runners.worker import bundle_processor

    assert bundle_processor.statesampler.StateSampler is ThreadlessStateSampler
