"""``ratebeam.yaml`` options of the Prometheus fetcher (`cloudkitty/fetcher/prometheus.py:79-148`).

```yaml
fetcher: {backend: prometheus, url: http://127.0.0.1:9090/api/v1, metric: openstack_identity_project_info,
          scope_attribute: project_id, filters: {domain_id: default}, timeout: 60, ...}
```
The connection options are the Prometheus collector's.  Label names (``scope_attribute``, filter
keys) and the metric name are checked against the PromQL grammar here: PromQL cannot quote them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator

from ratebeam.connectors.collectors.prometheus.config import PrometheusOptions
from ratebeam.connectors.collectors.prometheus.promql import check_label_name, check_metric_name
from ratebeam.connectors.config_model import INPUT, Invalid, NonEmptyStr, Text, shown_type


def _promql_name(check: Any, value: str, shown: object = INPUT) -> str:
    try:
        return check(value)
    except ValueError as exc:
        raise Invalid(str(exc).split(":")[0], shown) from None


def _filters(raw: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, dict):
        raise Invalid("expected a mapping of label names to values")
    for key, value in raw.items():
        if not isinstance(key, str) or not key:
            raise Invalid("expected a non-empty string", key)
        _promql_name(check_label_name, key, key)
        if not isinstance(value, str):
            raise Invalid("expected a string", value, (key,))
    return tuple(raw.items())


class PrometheusFetcherConfig(PrometheusOptions):
    """The ``prometheus`` fetcher: scope ids = values of ``scope_attribute`` on ``metric``."""

    backend: Literal["prometheus"] = Field(description="The Prometheus fetcher: the scopes are the values of a label of one metric (CloudKitty's `[fetcher_prometheus]`).")
    metric: NonEmptyStr = Field(description="The metric whose label values are the scopes.")
    scope_attribute: NonEmptyStr = Field("project_id", description="The label whose distinct values are the scope ids.")
    filters: Annotated[tuple[tuple[Text, Text], ...], BeforeValidator(_filters)] = Field(
        (), description="Label matchers the metric must match (values quoted), e.g. `{domain_id: default}`.",
        json_schema_extra=shown_type("mapping of label to value"))

    @field_validator("metric")
    @classmethod
    def _metric_name(cls, metric: str) -> str:
        return _promql_name(check_metric_name, metric)

    @field_validator("scope_attribute")
    @classmethod
    def _label_name(cls, label: str) -> str:
        return _promql_name(check_label_name, label)
