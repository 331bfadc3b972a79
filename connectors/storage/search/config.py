"""``ratebeam.yaml`` options of the Elasticsearch and OpenSearch storage backends (`cloudkitty/storage/v2/elasticsearch/client.py:232-316`, `cloudkitty/storage/v2/opensearch/client.py:100-116`).

```yaml
storage:
  backends:
    - {backend: opensearch, url: http://127.0.0.1:9200, index_name: cloudkitty,
       insecure: false, cafile: ca.pem, timeout: 60}
```
The keys are CloudKitty's ``[storage_elasticsearch]`` / ``[storage_opensearch]`` options (``host`` is
``url`` here); ``backend`` names the engine whose dialect is spoken.  ``use_datastream: true`` is
refused: ratebeam writes an index (data streams cannot overwrite a document by id, which idempotent
rewrites need).  ``scroll_duration`` has no use: retrieve pages with ``search_after``, no scroll
context is left open.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator

from ratebeam.connectors.config_model import Boolean, Invalid, NonEmptyStr
from ratebeam.connectors.http_options import HttpOptions

#: Characters Elasticsearch and OpenSearch refuse in an index name.
_BAD_INDEX_CHARS = set('\\/*?"<>| ,#:')


class SearchStorageConfig(HttpOptions):
    """One ``elasticsearch`` / ``opensearch`` storage section (and the backend's options)."""

    url_example: ClassVar[str] = "e.g. http://127.0.0.1:9200"

    backend: Literal["elasticsearch", "opensearch"] = Field("opensearch", description="Elasticsearch or OpenSearch, in CloudKitty's documents (CloudKitty's `[storage_elasticsearch]`, `[storage_opensearch]`).")
    url: NonEmptyStr = Field("http://localhost:9200", description="The server's http(s) URL.")
    index_name: NonEmptyStr = Field("cloudkitty", description="The index (lower case).")
    use_datastream: Boolean = Field(False, description="Refused when true: a data stream cannot overwrite a document by id.")

    @field_validator("index_name")
    @classmethod
    def _index_name(cls, index: str) -> str:
        if index != index.lower() or index.startswith(("-", "_", "+")) or _BAD_INDEX_CHARS & set(index) or index in (".", ".."):
            raise Invalid("not a valid index name (lower case, no \\/*?\"<>| ,#:)")
        return index

    @field_validator("use_datastream")
    @classmethod
    def _no_datastream(cls, use: bool) -> bool:
        if use:
            raise Invalid(
                "data streams are not supported: ratebeam rewrites a period's documents by id, which a "
                "data stream refuses; use an index (use_datastream: false)"
            )
        return use
