"""``ratebeam.yaml`` options of the ``source`` fetcher: ``{backend: source, scopes: [p1, p2]}``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ratebeam.connectors.config_model import ConfigModel, NonEmptyStringList


class SourceFetcherConfig(ConfigModel):
    """A static list of scope ids (CloudKitty's ``fetcher_source``)."""

    backend: Literal["source"] = Field("source", description="A fixed list of scopes (CloudKitty's `[fetcher_source]`).")
    scopes: NonEmptyStringList = Field(description="The scope ids to rate.")
