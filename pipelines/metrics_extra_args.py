"""``extra_args`` of ``metrics.yml`` per collector (`cloudkitty/collector/prometheus_base.py:37-60`), as pydantic models.

Each collector reads its own keys with CloudKitty's defaults; the validated model becomes the
collector's ``transforms.metric_defs`` dataclass (what the pipeline ships to workers).  A new
collector registers its model here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from ratebeam.connectors.collectors.prometheus.promql import LABEL_NAME, METRIC_NAME
from ratebeam.connectors.config_model import Boolean, ConfigModel, NonEmptyStr, Text, choice, integer
from ratebeam.transforms.metric_defs import (
    FILE_AGGREGATIONS,
    GNOCCHI_AGGREGATIONS,
    GNOCCHI_RE_AGGREGATIONS,
    PROMETHEUS_AGGREGATIONS,
    PROMETHEUS_QUERY_FUNCTIONS,
    PROMETHEUS_RANGE_FUNCTIONS,
    FileExtraArgs,
    GnocchiExtraArgs,
    PrometheusExtraArgs,
)


class PrometheusArgs(ConfigModel):
    """``extra_args`` of a metric collected from Prometheus: how the PromQL query is built."""

    aggregation_method: choice(PROMETHEUS_AGGREGATIONS) = Field("max", description="The PromQL aggregation over the groupby labels (and, without `range_function`, `<method>_over_time`).")
    query_function: choice(PROMETHEUS_QUERY_FUNCTIONS) | None = Field(None, description="A function applied to the range result (e.g. `abs`).")
    range_function: choice(PROMETHEUS_RANGE_FUNCTIONS) | None = Field(None, description="A range function instead of `<aggregation>_over_time` (e.g. `rate`).")
    query_prefix: Text = Field("", description="Text put before the query (a metric whose prefix may merge scopes is collected per scope).")
    query_suffix: Text = Field("", description="Text put after the query.")


class GnocchiArgs(ConfigModel):
    """``extra_args`` of a metric collected from Gnocchi (the section is required: ``resource_type``)."""

    resource_type: NonEmptyStr = Field(description="The Gnocchi resource type of the metric.")
    resource_key: NonEmptyStr = Field("id", description="The attribute that identifies a resource in the points.")
    aggregation_method: choice(
        GNOCCHI_AGGREGATIONS, "mean, sum, last, max, min, std, median, first, count, <1-99>pct, or rate:<one of them>"
    ) = Field("max", description="The aggregation of the metric's measures.")
    re_aggregation_method: choice(
        GNOCCHI_RE_AGGREGATIONS, "mean, sum, last, max, min, std, median, first, count, or rate:<one of them>"
    ) = Field("max", description="The aggregation across the resources grouped together.")
    force_granularity: integer(0) = Field(3600, description="The granularity (seconds) asked for; 0: the period.")
    use_all_resource_revisions: Boolean = Field(True, description="Take the metadata of every revision of a resource alive in the period (CloudKitty's default), or only the latest.")
    custom_query: Text = Field("", description="Gnocchi's aggregates operations to send instead of the built one.")


class FileArgs(ConfigModel):
    """``extra_args`` of a metric read by the file collector: how samples of a period aggregate."""

    aggregation_method: choice(FILE_AGGREGATIONS) = Field("max", description="How the samples of one series in a period fold into one value.")


@dataclass(frozen=True)
class ExtraArgsSpec:
    """How one collector reads ``extra_args``: its model, the dataclass it becomes, whether required."""

    model: type[ConfigModel]
    cls: type
    section_required: bool = False
    #: The backend's grammar for metric and label names (PromQL cannot quote them), if it has one.
    name_patterns: tuple[re.Pattern[str], re.Pattern[str]] | None = None

    def build(self, args: ConfigModel | None) -> Any:
        """The collector's dataclass of validated ``args`` (its defaults when absent)."""
        return self.cls() if args is None else self.cls(**dict(args))


EXTRA_ARGS: dict[str, ExtraArgsSpec] = {
    "prometheus": ExtraArgsSpec(PrometheusArgs, PrometheusExtraArgs, name_patterns=(METRIC_NAME, LABEL_NAME)),
    "gnocchi": ExtraArgsSpec(GnocchiArgs, GnocchiExtraArgs, section_required=True),
    "file": ExtraArgsSpec(FileArgs, FileExtraArgs),
    # The Prometheus collector's queries, sent through Aetos.
    "aetos": ExtraArgsSpec(PrometheusArgs, PrometheusExtraArgs, name_patterns=(METRIC_NAME, LABEL_NAME)),
}
"""``extra_args`` schema per collector backend."""
