"""``ratebeam.yaml`` options of the ``file`` collector: ``{backend: file, url: usage/, format: auto}``."""

from __future__ import annotations

from typing import Literal

from ratebeam.connectors.config_model import ConfigModel, Location, NonEmptyStr, choice, integer

FILE_FORMATS = ("auto", "parquet", "csv", "jsonl")


class FileCollectorConfig(ConfigModel):
    """Usage files at an fsspec URL or path (a file, a directory or a glob), in one format or ``auto``."""

    backend: Literal["file"] = "file"
    url: Location
    format: choice(FILE_FORMATS, ", ".join(FILE_FORMATS)) = "auto"  # type: ignore[valid-type]  # built at run time (config_model)
    #: Samples held in memory before they are spilled to local Parquet (``spill.py``): bounds memory.
    spill_rows: integer(1, 10**12) = 1_000_000  # type: ignore[valid-type]  # built at run time (config_model)
    #: A local directory for the spill (default: the system's temporary directory, ``TMPDIR``).
    spill_dir: NonEmptyStr | None = None
