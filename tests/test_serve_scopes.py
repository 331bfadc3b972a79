"""``ratebeam serve`` picks up a scope that appears while it runs, as the next bounded run would.

A private Prometheus (backfilled, ``servers.prometheus.backfilled``) holds instances of p1 and p2
for four hours and one of p3 from 02:00 on only.  The fetcher lists the projects that have an
instance series at each tick's ``now`` (an instant query at that time): p3 is absent at tick 0
(01:30) and present from tick 1 (02:30).  One ``serve`` job of three ticks must store and commit
what three bounded ``ratebeam run`` cycles at the same instants do, p3 included.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from pipeline_support import ratebeam, setup_database, stored_rows
from servers.prism import prism_endpoint  # noqa: F401  (session fixture)
from servers.prometheus import SAMPLES, START, PrometheusServer, Series, backfilled
from test_portable_runners import states
from test_prometheus_pipeline import workspace
from test_serve import serve_args

TICK_0 = START + timedelta(hours=1, minutes=30)
STEP = 3600
TICKS = 3


def instance(scope: str, vm: str, from_hour: int = 0) -> Series:
    """An instance of ``scope``, up (1) from ``from_hour`` on, absent before."""
    return Series("ratebeam_instance_up", "gauge", {"project_id": scope, "id": vm, "flavor_name": "m1.small"},
                  tuple(1.0 if k // 60 >= from_hour else None for k in range(SAMPLES)))


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory) -> Iterator[PrometheusServer]:
    series = (instance("p1", "i1"), instance("p2", "i2"), instance("p3", "i3", from_hour=2))
    with backfilled(tmp_path_factory.mktemp("prometheus-new-scope"), series) as server:
        yield server


def configured(root, api: str):
    config = workspace(root, api, fetcher={"backend": "prometheus", "url": api, "metric": "ratebeam_instance_up"})
    setup_database(config)
    return config


def test_a_scope_that_appears_between_ticks_is_rated_from_the_next_tick(tmp_path, prometheus, prism_endpoint):  # noqa: F811
    reference = configured(tmp_path / "bounded", prometheus.api)
    after = []
    for k in range(TICKS):
        done = ratebeam("run", "-c", str(reference), "--now", (TICK_0 + timedelta(seconds=k * STEP)).isoformat())
        assert done.returncode == 0, done.stderr[-3000:]
        after.append(states(reference))
    assert "p3" not in after[0] and "p3" in after[1]  # the fetcher lists p3 from tick 1 on
    assert "p3" in set(stored_rows(reference)["scope_id"].to_list())

    config = configured(tmp_path / "ws", prometheus.api)
    done = ratebeam(*serve_args(config, prism_endpoint, ticks=TICKS, start=TICK_0, step=STEP), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ratebeam serve: stopped after 1 job(s)" in done.stderr  # one job: p3 was found while it ran
    assert states(config) == after[-1]
    assert stored_rows(config).equals(stored_rows(reference))
