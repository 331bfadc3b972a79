"""``ratebeam.yaml`` options of the ``file`` collector: ``{backend: file, url: usage/, format: auto}``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ratebeam.connectors.config_model import ConfigModel, Location, NonEmptyStr, choice, integer

FILE_FORMATS = ("auto", "parquet", "csv", "jsonl")


class FileCollectorConfig(ConfigModel):
    """Usage files at an fsspec URL or path (a file, a directory or a glob), in one format or ``auto``."""

    backend: Literal["file"] = Field("file", description="Usage samples in files: a file, a directory or a glob.")
    url: Location = Field(description="Where the usage files are (columns: [formats.md](formats.md#usage-samples-the-file-collector)).")
    format: choice(FILE_FORMATS, ", ".join(FILE_FORMATS)) = Field("auto", description="The files' format; `auto`: by each file's extension.")  # type: ignore[valid-type]  # built at run time (config_model)
    spill_rows: integer(1, 10**12) = Field(1_000_000, description="Samples held in memory before they are spilled to local Parquet: bounds a run's memory.")  # type: ignore[valid-type]  # built at run time (config_model)
    spill_dir: NonEmptyStr | None = Field(None, description="A local directory for the spill (default: the system's temporary directory, `TMPDIR`).")
