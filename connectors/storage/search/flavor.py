"""What differs between Elasticsearch and OpenSearch for ratebeam, declared as data (`cloudkitty/storage/v2/elasticsearch/client.py:232-316`, `cloudkitty/storage/v2/opensearch/client.py:100-116`).

One implementation (``search.py``) serves both engines; it reads these few facts instead of testing
which engine it talks to:

* ``keyword_suffix``: CloudKitty's OpenSearch driver never applies its mapping (`cloudkitty/storage/v2/opensearch/client.py:100-116`), so its
  indices are dynamically mapped (``text`` + ``.keyword`` sub-field) and its API aggregates and
  filters on ``<field>.keyword``.  ratebeam queries ``<field>.keyword`` on OpenSearch too, and its
  own OpenSearch mapping gives every keyword field a ``keyword`` sub-field, so ratebeam's queries
  work on indices CloudKitty made and CloudKitty's API works on indices ratebeam made.  On
  Elasticsearch strings are plain ``keyword`` fields, queried directly.
* ``description_field``: CloudKitty's Elasticsearch documents carry ``"description": null``, its
  OpenSearch documents omit the key.

Both engines take the mapping with ``PUT /<index>/_mapping`` (CloudKitty's ``include_type_name``
call is gone from ES 8 and its OpenSearch ``POST /<index>/_doc`` stores the mapping as a document)
and bulk-index with ``POST /<index>/_bulk``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EngineFlavor:
    """One search engine's dialect."""

    name: str
    #: appended to string fields in queries, sorts and aggregations
    keyword_suffix: str
    #: documents carry ``"description": null``
    description_field: bool

    def keyword(self, field: str) -> str:
        """The field to filter, sort or aggregate on for the string field ``field``."""
        return field + self.keyword_suffix

    def string_mapping(self) -> dict[str, Any]:
        """How a string field (fixed or dynamic) is mapped in an index ratebeam creates."""
        if self.keyword_suffix:
            suffix = self.keyword_suffix.lstrip(".")
            return {"type": "keyword", "fields": {suffix: {"type": "keyword"}}}
        return {"type": "keyword"}


ELASTICSEARCH = EngineFlavor(name="elasticsearch", keyword_suffix="", description_field=True)
OPENSEARCH = EngineFlavor(name="opensearch", keyword_suffix=".keyword", description_field=False)
