"""The shapes of Elasticsearch/OpenSearch answers the backend reads, checked before it reads them.

A proxy's error page, a server that is not Elasticsearch/OpenSearch or a hostile one must fail its
command or frame saying what it sent (``RetriableConnectorError``: the frame is written again by a
later run), never with a ``KeyError`` or ``AttributeError`` from deep inside the reader.
``SearchHttp.request`` already refuses a successful answer that is not a JSON object; this module
checks what is inside one.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any, TypeVar

from ratebeam.connectors.errors import RetriableConnectorError


def _shown(answer: Any) -> str:
    return json.dumps(answer, default=str)[:200]


def search_problem(answer: Any, body: dict[str, Any]) -> str:
    """What is wrong with a ``_search`` answer's shape ('' when nothing): the keys the backend reads."""
    if isinstance(answer, dict) and "error" in answer and "text" in answer:  # not JSON at all
        return str(answer["error"])[:300]
    hits = answer.get("hits") if isinstance(answer, dict) else None
    if not isinstance(hits, dict) or not isinstance(hits.get("hits"), list):
        return f"no hits list: {_shown(answer)}"
    if body.get("track_total_hits") and not isinstance((hits.get("total") or {}).get("value") if isinstance(
            hits.get("total"), dict) else None, int):
        return f"no hits total: {_shown(answer)}"
    if "aggs" in body and not isinstance(answer.get("aggregations"), dict):
        return f"no aggregations: {_shown(answer)}"
    return ""


def mapping_properties(answer: dict[str, Any], where: str) -> dict[str, Any]:
    """The fields an index's ``_mapping`` answer (``{index name: {"mappings": {"properties": ...}}}``) lists."""
    index: Any = next(iter(answer.values()), {})
    mappings = index.get("mappings", {}) if isinstance(index, dict) else None
    properties = mappings.get("properties", {}) if isinstance(mappings, dict) else None
    if not isinstance(properties, dict):
        raise RetriableConnectorError(f"{where}: malformed mapping answer (no mappings.properties): {_shown(answer)}")
    return properties


def bulk_results(answer: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """The per-document results of a ``_bulk`` answer that has ``errors`` (each with an integer ``status``)."""
    items = answer.get("items")
    if not isinstance(items, list):
        items = []
    results = [next(iter(item.values())) for item in items if isinstance(item, dict) and len(item) == 1]
    if not results or len(results) != len(items) or \
            not all(isinstance(r, dict) and isinstance(r.get("status"), int) for r in results):
        raise RetriableConnectorError(f"{where}: malformed bulk answer (errors without their items): {_shown(answer)}")
    return results


_Method = TypeVar("_Method", bound=Callable[..., Any])


def reads_answers(method: _Method) -> _Method:
    """Decorates a backend method reading hits and aggregations: a key or type they lack is a malformed answer."""

    @functools.wraps(method)
    def reading(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except KeyError as exc:
            raise RetriableConnectorError(
                f"{self.http.where()}: malformed search answer (a hit or an aggregation has no {exc})") from None
        except (TypeError, AttributeError, IndexError) as exc:
            raise RetriableConnectorError(
                f"{self.http.where()}: malformed search answer (a hit or an aggregation of the wrong shape: {exc})"
            ) from None

    return reading  # type: ignore[return-value]
