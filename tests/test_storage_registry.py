"""The storage registry: configs become backends by name, heavy modules load only when asked for."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

import pytest
from storage_conformance import JANUARY, T0, point, rated_table

from ratebeam.connectors.errors import FatalConnectorError
from ratebeam.connectors.registry import make_backend, names
from ratebeam.connectors.storage.parquet.backend import ParquetStorage


@dataclass
class Config:
    backend: str
    url: str
    storage_options: dict[str, Any] = field(default_factory=dict)


def test_parquet_config_makes_a_working_backend(tmp_path):
    backend = make_backend(Config("parquet", str(tmp_path / "store")))
    assert isinstance(backend, ParquetStorage)
    backend.init()
    backend.write(rated_table([point("p1", "instance", T0)]))
    assert make_backend(Config("parquet", str(tmp_path / "store"))).retrieve(*JANUARY).total == 1


def test_config_with_nested_options(tmp_path):
    @dataclass
    class Options:
        url: str

    @dataclass
    class StorageConfig:  # the shape of pipelines.config.StorageConfig
        backend: str
        options: Options

    backend = make_backend(StorageConfig("parquet", Options(f"{tmp_path}/nested")))
    backend.init()
    assert backend.write(rated_table([point("p1", "instance", T0)])) == 1
    assert (tmp_path / "nested" / "type=instance" / "scope=p1").is_dir()


def test_storage_options_reach_the_filesystem(tmp_path):
    backend = make_backend(Config("parquet", f"file://{tmp_path}/store", {"auto_mkdir": True}))
    assert backend._fs.auto_mkdir is True


def test_unknown_backend_names_the_known_ones():
    assert "parquet" in names("storage")
    with pytest.raises(FatalConnectorError, match=r"unknown storage backend 'nosql'.*parquet"):
        make_backend(Config("nosql", "x"))
    with pytest.raises(FatalConnectorError, match="unknown storage backend None"):
        make_backend(object())


def test_registry_imports_no_backend_until_asked():
    code = (
        "import sys; import ratebeam.connectors.registry; "
        "print('ratebeam.connectors.storage.parquet.backend' in sys.modules, 'polars' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
