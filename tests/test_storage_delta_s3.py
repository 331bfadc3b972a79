"""The Delta Lake backend on an object store: ``s3://`` against a real S3 server (SeaweedFS's gateway).

The whole storage conformance suite, concurrent writers on different scopes (delta-rs commits with
S3's conditional puts: no lock service), and the demo rated end to end into a bucket, which must
store exactly what the local table stores.  SeaweedFS is a real S3 implementation (not a mock);
AWS S3 itself cannot be reached from here.
"""

from __future__ import annotations

import itertools

import pytest
from delta_support import assert_concurrent_writers_all_land
from pipeline_support import run_cycle, setup_database, stored_rows, workspace
from servers.seaweedfs import s3_server  # noqa: F401  (session fixture)
from storage_conformance import StorageConformance

from ratebeam.connectors.storage.delta.backend import DeltaStorage


class TestDeltaS3Conformance(StorageConformance):
    @pytest.fixture
    def make_backend(self, s3_server):  # noqa: F811
        bucket, counter = s3_server.bucket(), itertools.count()
        return lambda: DeltaStorage(f"s3://{bucket}/store{next(counter)}", storage_options=s3_server.storage_options)


def test_concurrent_writers_on_different_scopes_all_land_on_s3(s3_server):  # noqa: F811
    assert_concurrent_writers_all_land(f"s3://{s3_server.bucket()}/store", scopes=3, hours=6,
                                       storage_options=s3_server.storage_options)


def test_the_demo_rated_into_a_bucket_stores_what_the_local_table_stores(rated, tmp_path, s3_server):  # noqa: F811
    bucket = s3_server.bucket()
    config = workspace(tmp_path / "ws", storage={"backends": [
        {"backend": "delta", "url": f"s3://{bucket}/rated", "storage_options": s3_server.storage_options}]})
    setup_database(config)
    done = run_cycle(config)
    assert done.returncode == 0, done.stderr
    rows = stored_rows(config)
    assert rows.height > 0 and rows.equals(stored_rows(rated))
    keys = s3_server.keys(bucket)
    assert any(k.startswith("rated/_delta_log/") for k in keys) and any(k.endswith(".parquet") for k in keys)
