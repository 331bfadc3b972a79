"""``ratebeam.yaml`` options of the Gnocchi fetcher (`cloudkitty/fetcher/gnocchi.py:87-168`).

```yaml
fetcher: {backend: gnocchi, url: http://127.0.0.1:8041, username: admin,
          resource_types: [generic], scope_attribute: project_id, timeout: 60, ...}
```
The connection options are the Gnocchi collector's.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ratebeam.connectors.collectors.gnocchi.config import GnocchiOptions
from ratebeam.connectors.config_model import NonEmptyStr, NonEmptyStringList


class GnocchiFetcherConfig(GnocchiOptions):
    """The ``gnocchi`` fetcher: scope ids = values of ``scope_attribute`` of the resources of ``resource_types``."""

    backend: Literal["gnocchi"] = Field(description="The Gnocchi fetcher: the scopes are the values of an attribute of Gnocchi's resources (CloudKitty's `[fetcher_gnocchi]`); the connection keys are the Gnocchi collector's.")
    resource_types: NonEmptyStringList = Field(("generic",), description="The resource types whose resources are searched.")
    scope_attribute: NonEmptyStr = Field("project_id", description="The resource attribute whose distinct values are the scope ids.")
