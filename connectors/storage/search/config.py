"""``ratebeam.yaml`` options of the Elasticsearch and OpenSearch storage backends (spec §7.4, §7.5).

```yaml
storage:
  backends:
    - {backend: opensearch, url: http://127.0.0.1:9200, index_name: cloudkitty,
       insecure: false, cafile: ca.pem, timeout: 60}
```
The keys are CloudKitty's ``[storage_elasticsearch]`` / ``[storage_opensearch]`` options (``host`` is
``url`` here).  ``use_datastream: true`` is refused: ratebeam writes an index (data streams cannot
overwrite a document by id, which idempotent rewrites need).  ``scroll_duration`` has no use:
retrieve pages with ``search_after``, no scroll context is left open.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ratebeam.pipelines.config_http import cafile_option, timeout_option
from ratebeam.pipelines.metrics_config import Where

REQUIRED = ("url",)
OPTIONAL = ("index_name", "insecure", "cafile", "timeout", "use_datastream")
#: Characters Elasticsearch and OpenSearch refuse in an index name.
_BAD_INDEX_CHARS = set('\\/*?"<>| ,#:')


@dataclass(frozen=True)
class SearchStorageConfig:
    """One ``elasticsearch`` / ``opensearch`` storage section, validated."""

    url: str
    #: ``elasticsearch`` or ``opensearch``: which engine's dialect to speak.
    flavor: str = "opensearch"
    index_name: str = "cloudkitty"
    verify: bool = True
    cafile: str | None = None
    timeout: float = 60.0


def build(where: Where, raw: dict[str, Any], base: Path) -> SearchStorageConfig:
    """The storage section as a typed config, or an ``InputError`` naming the key and value."""
    url = where.key("url").string(raw["url"])
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise where.key("url").error("not an http(s) URL (e.g. http://127.0.0.1:9200)", url)
    index = where.key("index_name").string(raw.get("index_name", "cloudkitty"))
    if index != index.lower() or index.startswith(("-", "_", "+")) or _BAD_INDEX_CHARS & set(index) or index in (".", ".."):
        raise where.key("index_name").error("not a valid index name (lower case, no \\/*?\"<>| ,#:)", index)
    if where.key("use_datastream").boolean(raw.get("use_datastream", False)):
        raise where.key("use_datastream").error(
            "data streams are not supported: ratebeam rewrites a period's documents by id, which a "
            "data stream refuses; use an index (use_datastream: false)",
            True,
        )
    cafile = cafile_option(where, raw, base)
    timeout = timeout_option(where, raw)
    return SearchStorageConfig(
        url=url,
        flavor=raw["backend"],
        index_name=index,
        verify=not where.key("insecure").boolean(raw.get("insecure", False)),
        cafile=cafile,
        timeout=timeout,
    )


#: ``BackendSpec(*SPEC)`` for both names in ``pipelines.config.STORAGES``.
SPEC = (REQUIRED, OPTIONAL, build)
