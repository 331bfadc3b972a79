"""``ratebeam.yaml`` options of the Gnocchi fetcher (spec §3.4).

```yaml
fetcher: {backend: gnocchi, url: http://127.0.0.1:8041, username: admin,
          resource_types: [generic], scope_attribute: project_id, timeout: 60, ...}
```
The connection options are the Gnocchi collector's.
"""

from __future__ import annotations

from typing import Literal

from ratebeam.connectors.collectors.gnocchi.config import GnocchiOptions
from ratebeam.connectors.config_model import NonEmptyStr, NonEmptyStringList


class GnocchiFetcherConfig(GnocchiOptions):
    """The ``gnocchi`` fetcher: scope ids = values of ``scope_attribute`` of the resources of ``resource_types``."""

    backend: Literal["gnocchi"]
    resource_types: NonEmptyStringList = ("generic",)
    scope_attribute: NonEmptyStr = "project_id"
