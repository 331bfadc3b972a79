"""A run that dies of something ``except Exception`` does not catch still gives its leases back.

A Polars panic (``pyo3_runtime.PanicException``) and ``KeyboardInterrupt`` derive from
``BaseException`` only; a run dying of one used to keep every scope it had leased blocked until the
lease expired.  The panic here is a real one, from Polars, raised inside the
rating stage of a real cycle (the rater is the only piece swapped).
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import polars as pl
import pytest
from hardening_support import prepared, query

from ratebeam.pipelines.config import load_config
from ratebeam.pipelines.cycle import run_cycle


class _Dies:
    """A rater factory whose rater dies of ``kind`` while rating (picklable: Beam ships it)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __call__(self):
        def rate(usage: pl.DataFrame):
            if self.kind == "panic":
                pl.Series([Decimal("NaN")], dtype=pl.Decimal(38, 18))  # Polars panics on a NaN decimal
            raise KeyboardInterrupt
        return rate


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("death") / "ws"
    config = prepared(root, fetcher={"backend": "source", "scopes": ["p1", "p2"]})
    (root / "usage.csv").write_text(
        "metric,timestamp,value,project_id,id\n"
        "openstack_nova_server_status,2026-01-01T00:30:00Z,1,p1,vm-1\n"
        "openstack_nova_server_status,2026-01-01T00:30:00Z,1,p2,vm-2\n"
    )
    return config


@pytest.mark.parametrize("kind", ["panic", "interrupt"])
def test_a_run_dying_of_a_base_exception_releases_its_leases(config, kind):
    with pytest.raises(BaseException) as info:
        run_cycle(load_config(config), _Dies(kind), now=datetime(2026, 1, 1, 4, tzinfo=UTC))
    if kind == "panic":  # Beam re-raises the panic as it is; the interrupt as a RuntimeError saying so
        assert type(info.value).__name__ == "PanicException" and not isinstance(info.value, Exception)
    else:
        assert "KeyboardInterrupt" in repr(info.value)
    root = config.parent
    assert query(root, "SELECT count(*) FROM ratebeam_scope_leases") == [(0,)]
    assert query(root, "SELECT count(*) FROM cloudkitty_storage_states WHERE last_processed_timestamp IS NOT NULL") \
        == [(0,)]
    assert not (root / "rated").exists() or not list((root / "rated").rglob("*.parquet"))
