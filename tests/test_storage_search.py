"""The Elasticsearch and OpenSearch backends against real servers (tests/servers/search.py).

The conformance suite runs on both engines; then what only these backends promise: CloudKitty's
document shape (`cloudkitty/storage/v2/elasticsearch/client.py:232-316`), deterministic ids (a rewrite keeps one copy, same-groupby points stay
two), scoped deletes (CloudKitty's delete drops the scope, `cloudkitty/storage/v2/elasticsearch/client.py:369-383`), rejected bulk items raise,
and an end-to-end run whose ``report summary`` equals Parquet's.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from decimal import Decimal

import polars as pl
import pytest
import requests
import yaml
from pipeline_support import ratebeam, run_cycle, setup_database, workspace
from servers.search import elasticsearch_url, opensearch_url  # noqa: F401  (session fixtures)
from storage_conformance import (
    HOUR,
    JANUARY,
    T0,
    StorageConformance,
    point,
    rated_table,
    sample,
    table_points,
)

from ratebeam.connectors.errors import SkippableConnectorError
from ratebeam.connectors.storage.base import TotalQuery
from ratebeam.connectors.storage.search.backend import (
    ElasticsearchStorage,
    OpenSearchStorage,
    SearchStorage,
)
from ratebeam.connectors.storage.search.config import SearchStorageConfig
from ratebeam.transforms.point_identity import point_ids

ENGINES = {"opensearch": OpenSearchStorage, "elasticsearch": ElasticsearchStorage}


def _url(request: pytest.FixtureRequest, engine: str) -> str:
    return request.getfixturevalue(f"{engine}_url")


class Indices:
    """Fresh indices on one server, deleted at the end of the test."""

    def __init__(self, engine: str, url: str) -> None:
        self.engine, self.url, self.names = engine, url, []

    def backend(self, **options) -> SearchStorage:
        self.names.append(f"ratebeam-test-{uuid.uuid4().hex[:12]}")
        return ENGINES[self.engine](SearchStorageConfig(backend=self.engine, url=self.url, index_name=self.names[-1], timeout=30, **options))

    def drop(self) -> None:
        for name in self.names:
            requests.delete(f"{self.url}/{name}", timeout=30)


@pytest.fixture(params=list(ENGINES))
def indices(request):
    engine = request.param
    made = Indices(engine, _url(request, engine))
    yield made
    made.drop()


class TestSearchConformance(StorageConformance):
    """The contract on each engine (``indices`` is parametrized over ``ENGINES``)."""

    @pytest.fixture
    def make_backend(self, indices):
        return indices.backend


# -- what only the search backends promise --------------------------------------------------------


@pytest.fixture
def store(indices):
    backend = indices.backend()
    backend.init()
    yield backend
    backend.close()


def documents(store: SearchStorage) -> list[dict]:
    url = f"{store.options.url}/{store.options.index_name}/_search"
    answer = requests.post(url, json={"size": 10_000, "query": {"match_all": {}}}, timeout=30).json()
    return answer["hits"]["hits"]


def test_documents_have_cloudkittys_shape(store):
    # CloudKitty's document (`cloudkitty/storage/v2/elasticsearch/client.py:232-316`).
    begin = datetime(2024, 1, 1, tzinfo=UTC)
    example = point(
        "p1",
        "instance",
        begin,
        "1",
        "4.8",
        {"id": "vm2", "flavor_name": "m1.large"},
        {"os_distro": "windows", "vcpus": "8"},
        unit="instance",
    )
    store.write(rated_table([example]))
    (hit,) = documents(store)
    expected = {
        "start": "2024-01-01T00:00:00+00:00",
        "end": "2024-01-01T01:00:00+00:00",
        "type": "instance",
        "unit": "instance",
        "qty": 1.0,
        "price": 4.8,
        "groupby": {
            "project_id": "p1",
            "id": "vm2",
            "flavor_name": "m1.large",
            "week_of_the_year": "00",
            "day_of_the_year": "1",
            "month": "1",
            "year": "2024",
        },
        "metadata": {"os_distro": "windows", "vcpus": "8"},
        "scope_id": "p1",
        "point_id": hit["_id"],
    }
    if store.flavor.description_field:
        expected["description"] = None
    assert hit["_source"] == expected
    assert list(hit["_source"])[:4] == ["start", "end", "type", "unit"]


def test_absent_labels_are_left_out_of_documents(store):
    store.write(
        rated_table(
            [
                point("p1", "instance", T0, groupby={"flavor_name": "a"}),
                point("p1", "volume", T0, groupby={"volume_type": 'x"y\\z é'}),
            ]
        )
    )
    by_type = {hit["_source"]["type"]: hit["_source"] for hit in documents(store)}
    assert "volume_type" not in by_type["instance"]["groupby"]
    assert by_type["volume"]["groupby"]["volume_type"] == 'x"y\\z é'
    assert "flavor_name" not in by_type["volume"]["groupby"]
    assert by_type["volume"]["metadata"] == {}


def test_writing_twice_keeps_the_document_count(store):
    store.write(rated_table(sample()))
    first = sorted(hit["_id"] for hit in documents(store))
    store.write(rated_table(sample()))
    assert sorted(hit["_id"] for hit in documents(store)) == first
    assert len(first) == len(sample())


def test_same_groupby_points_stay_apart_and_rewrite_in_place(store):
    labels = {"id": "vm1"}
    points = [
        point("p1", "instance", T0, "1", "2", labels, {"vcpus": "1"}),
        point("p1", "instance", T0, "1", "3", labels, {"vcpus": "2"}),
    ]
    store.write(rated_table(points))
    store.write(rated_table(list(reversed(points))))  # another row order: same ids
    assert len(documents(store)) == 2
    store.write(rated_table(points[:1]))  # the slice now has one point: the other document goes
    assert [hit["_source"]["metadata"] for hit in documents(store)] == [{"vcpus": "1"}]


def test_point_ids_are_stable_and_independent_of_other_columns():
    points = [point("p1", "instance", T0, groupby={"id": "a"}), point("p1", "instance", T0, groupby={"id": "b"})]
    frame = pl.from_arrow(rated_table(points))
    ids = point_ids(frame).to_list()
    assert len(set(ids)) == 2 and all(len(i) == 32 for i in ids)
    widened = frame.with_columns(pl.lit(None, dtype=pl.String).alias("groupby.zone"))
    assert point_ids(widened).to_list() == ids
    assert point_ids(frame.reverse()).to_list() == ids[::-1]
    # The encoding is unambiguous: moving text between scope and type changes the id.
    shifted = [point("p1i", "nstance", T0, groupby={"id": "a"})]
    assert point_ids(pl.from_arrow(rated_table(shifted))).to_list()[0] != ids[0]


def test_scoped_delete_keeps_the_other_scopes(store):
    # CloudKitty's delete ignores the scope filter and wipes every scope of the window (`cloudkitty/storage/v2/elasticsearch/client.py:369-383`).
    store.write(rated_table(sample()))
    store.delete(T0, T0 + 3 * HOUR, {"scope_id": "p1"})
    scopes = sorted({hit["_source"]["scope_id"] for hit in documents(store)})
    assert scopes == ["p2"]
    assert len(documents(store)) == len(sample()) // 2


def test_rejected_bulk_items_raise(indices):
    backend = indices.backend()
    name = indices.names[-1]
    # An index where groupby.size is a number: a non-numeric value is rejected item by item.
    mapping = {"mappings": {"properties": {"groupby": {"properties": {"size": {"type": "long"}}}}}}
    assert requests.put(f"{indices.url}/{name}", json=mapping, timeout=30).ok
    backend.init()
    good = point("p1", "volume", T0, groupby={"size": "10"})
    bad = point("p2", "volume", T0, groupby={"size": "ten"})
    with pytest.raises(SkippableConnectorError, match=r"rejected 1 document\(s\).*(mapper_parsing|document_parsing)"):
        backend.write(rated_table([good, bad]))
    backend.close()


def test_init_adds_missing_fields_to_an_existing_index(indices):
    backend = indices.backend()
    name = indices.names[-1]
    assert requests.put(f"{indices.url}/{name}", timeout=30).ok  # made by someone else, no mapping
    backend.init()
    backend.init()
    backend.write(rated_table(sample()))
    assert backend.retrieve(*JANUARY, filters={"scope_id": "p1"}).total == len(sample()) // 2
    backend.close()


def test_paging_beyond_the_result_window(store, monkeypatch):
    from ratebeam.connectors.storage.search import backend as search

    monkeypatch.setattr(search, "RESULT_WINDOW", 4)  # search_after instead of from/size
    points = [point("p1", "instance", T0 + h * HOUR, str(h), groupby={"id": str(i)}) for h in range(3) for i in range(5)]
    store.write(rated_table(points))
    whole = table_points(store.retrieve(*JANUARY, limit=100).points)
    pages = [table_points(store.retrieve(*JANUARY, offset=o, limit=3).points) for o in range(0, 15, 3)]
    assert [p for page in pages for p in page] == whole and len(whole) == 15


def test_total_iterates_every_composite_page(store, monkeypatch):
    from ratebeam.connectors.storage.search import backend as search

    monkeypatch.setattr(search, "COMPOSITE_PAGE", 2)
    store.write(rated_table([point("p1", "instance", T0, "1", "0.5", {"id": str(i)}) for i in range(7)]))
    result = store.total(TotalQuery(("id",), *JANUARY, limit=3, offset=2))
    assert result.total == 7
    assert [r["id"] for r in result.results] == ["2", "3", "4"]


# -- end to end -----------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", list(ENGINES))
def test_end_to_end_summary_equals_parquet(tmp_path, request, engine):
    url = _url(request, engine)
    index = f"ratebeam-e2e-{uuid.uuid4().hex[:12]}"
    config = workspace(tmp_path / "search")
    doc = yaml.safe_load(config.read_text())
    parquet = doc["storage"]["backends"][0]
    doc["storage"]["backends"] = [{"backend": engine, "url": url, "index_name": index}, parquet]
    config.write_text(yaml.safe_dump(doc))
    try:
        setup_database(config)
        done = run_cycle(config)
        assert done.returncode == 0, done.stderr
        parquet_first = config.with_name("parquet-first.yaml")
        parquet_first.write_text(yaml.safe_dump({**doc, "storage": {"backends": [parquet]}}))

        def summary(path, groupby):
            args = ("report", "summary", "-c", str(path), "--begin", "2026-01-01", "--end", "2026-02-01",
                    "--groupby", groupby, "--format", "json")
            out = ratebeam(*args)
            assert out.returncode == 0, out.stderr
            return json.loads(out.stdout)

        for groupby in ("project_id,type", "type,time-d"):
            searched, stored = summary(config, groupby), summary(parquet_first, groupby)
            assert searched["total"] == stored["total"] > 0
            for got, want in zip(searched["results"], stored["results"], strict=True):
                assert {k: v for k, v in got.items() if k not in ("qty", "rate")} == {
                    k: v for k, v in want.items() if k not in ("qty", "rate")
                }
                assert float(got["rate"]) == pytest.approx(float(Decimal(want["rate"])), rel=1e-9)
                assert float(got["qty"]) == pytest.approx(float(Decimal(want["qty"])), rel=1e-9)
        # A second run rates nothing new and the index keeps its documents.
        count = requests.get(f"{url}/{index}/_count", timeout=30).json()["count"]
        again = run_cycle(config)
        assert again.returncode == 0, again.stderr
        assert requests.get(f"{url}/{index}/_count", timeout=30).json()["count"] == count > 0
    finally:
        requests.delete(f"{url}/{index}", timeout=30)


def test_use_datastream_is_refused_clearly(tmp_path):
    from ratebeam.pipelines.config import load_config
    from ratebeam.pipelines.errors import InputError

    config = workspace(tmp_path)
    doc = yaml.safe_load(config.read_text())
    doc["storage"]["backends"] = [{"backend": "opensearch", "url": "http://127.0.0.1:1", "use_datastream": True}]
    config.write_text(yaml.safe_dump(doc))
    with pytest.raises(InputError, match=r"storage.backends\[0\].use_datastream: data streams are not supported"):
        load_config(config)


def test_reads_an_index_cloudkittys_opensearch_driver_made(opensearch_url):  # noqa: F811
    # CloudKitty's OpenSearch init() applies no mapping (`cloudkitty/storage/v2/opensearch/client.py:100-116`): its index is dynamically mapped
    # (text + .keyword) and its documents have no scope_id / point_id.  ratebeam reads them through
    # the .keyword sub-fields, as CloudKitty's API does.
    name = f"ratebeam-test-{uuid.uuid4().hex[:12]}"
    lines = []
    for i, (project, price) in enumerate([("p1", 1.5), ("p1", 2.0), ("p2", 4.0)]):
        doc = {"start": "2024-01-01T00:00:00+00:00", "end": "2024-01-01T01:00:00+00:00", "type": "instance",
               "unit": "instance", "qty": 1.0, "price": price,
               "groupby": {"project_id": project, "id": f"vm{i}"}, "metadata": {"flavor": "m1"}}
        lines += [json.dumps({"index": {}}), json.dumps(doc)]
    answer = requests.post(f"{opensearch_url}/{name}/_bulk?refresh=true", data="\n".join(lines) + "\n",
                           headers={"Content-Type": "application/x-ndjson"}, timeout=30)
    assert answer.ok and not answer.json()["errors"]
    backend = OpenSearchStorage(SearchStorageConfig(backend="opensearch", url=opensearch_url, index_name=name))
    try:
        backend.init()
        result = backend.total(TotalQuery(("project_id", "type"), *JANUARY, filters={"flavor": "m1"}))
        assert [(r["project_id"], r["type"], r["rate"]) for r in result.results] == [
            ("p1", "instance", 3.5),
            ("p2", "instance", 4.0),
        ]
        got = table_points(backend.retrieve(*JANUARY, filters={"project_id": "p2"}).points)
        assert [(p.groupby["id"], p.metadata, p.price) for p in got] == [("vm2", {"flavor": "m1"}, 4)]
    finally:
        backend.close()
        requests.delete(f"{opensearch_url}/{name}", timeout=30)


def test_config_builds_the_backend_through_the_registry(tmp_path):
    from ratebeam.connectors.registry import make_backend
    from ratebeam.pipelines.config import load_config

    config = workspace(tmp_path)
    doc = yaml.safe_load(config.read_text())
    doc["storage"]["backends"] = [
        {"backend": "elasticsearch", "url": "https://es.example:9200", "index_name": "rated", "insecure": True,
         "timeout": 5},
        {"backend": "opensearch", "url": "http://127.0.0.1:9200"},
    ]
    config.write_text(yaml.safe_dump(doc))
    es, os_ = (make_backend(c) for c in load_config(config).storage)
    assert isinstance(es, ElasticsearchStorage) and isinstance(os_, OpenSearchStorage)
    assert es.options == SearchStorageConfig(
        backend="elasticsearch", url="https://es.example:9200", index_name="rated", insecure=True, cafile=None, timeout=5.0
    )
    assert os_.options.index_name == "cloudkitty"


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("url", "127.0.0.1:9200", "not an http"),
        ("index_name", "Rated", "not a valid index name"),
        ("timeout", 0, "expected a number of seconds"),
        ("cafile", "missing.pem", "no such file"),
    ],
)
def test_bad_options_are_refused_clearly(tmp_path, key, value, message):
    from ratebeam.pipelines.config import load_config
    from ratebeam.pipelines.errors import InputError

    config = workspace(tmp_path)
    doc = yaml.safe_load(config.read_text())
    doc["storage"]["backends"] = [{"backend": "opensearch", "url": "http://127.0.0.1:9200", key: value}]
    config.write_text(yaml.safe_dump(doc))
    with pytest.raises(InputError, match=rf"storage.backends\[0\].{key}: {message}"):
        load_config(config)


def test_an_unreachable_server_is_a_retriable_error():
    import socket

    from ratebeam.connectors.errors import RetriableConnectorError
    from ratebeam.connectors.storage.search.client import SearchHttp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    http = SearchHttp(f"http://127.0.0.1:{port}", "opensearch", timeout=2, attempts=3, base_delay=0.01)
    with pytest.raises(RetriableConnectorError, match="after 3 attempts"):
        http.request("GET", "/_cluster/health")
