"""Shared fixtures: databases for the SQL layer (SQLite and the real PostgreSQL of tests/servers)."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable, Iterator
from urllib.parse import quote

import fsspec
import pytest
from pipeline_support import rated_once, workspace
from servers.postgres import pg_url  # noqa: F401  (session fixture, used through db_url)
from sqlalchemy import Engine

from ratebeam.connectors.sql.migrations import make_engine, upgrade


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    """The url of an empty database: a SQLite file, or a private schema of the test PostgreSQL."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ratebeam.db'}"
        return
    yield from _private_schema(request.getfixturevalue("pg_url"))


@pytest.fixture
def pg_db_url(pg_url: str) -> Iterator[str]:  # noqa: F811
    """The url of an empty private schema of the test PostgreSQL (tests that need PostgreSQL itself)."""
    yield from _private_schema(pg_url)


def _private_schema(base: str) -> Iterator[str]:
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:12]}"
    conninfo = make_engine(base).url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    separator = "&" if "?" in base else "?"
    try:
        yield f"{base}{separator}options={quote(f'-csearch_path={schema}')}"
    finally:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture
def empty_engine(db_url: str) -> Iterator[Engine]:
    """An engine on ``db_url`` whose schema was never created."""
    engine = make_engine(db_url)
    yield engine
    engine.dispose()


@pytest.fixture
def engine(empty_engine: Engine) -> Engine:
    """A migrated database, once on SQLite and once on PostgreSQL (marked ``postgres``)."""
    upgrade(empty_engine)
    return empty_engine


@pytest.fixture(scope="module")
def rated(tmp_path_factory):
    """A demo workspace rated once per test module; tests work on copies of it (``copy``)."""
    return rated_once(workspace(tmp_path_factory.mktemp("rated") / "ws"))


@pytest.fixture
def copy(rated, tmp_path):
    """A private copy of the rated demo workspace; returns its ratebeam.yaml."""
    target = tmp_path / "ws"
    shutil.copytree(rated.parent, target)
    return target / "ratebeam.yaml"


@pytest.fixture
def memory_file() -> Iterator[Callable[[str, str], str]]:
    """``memory_file(name, text)``: the ``memory://`` URL of a new file holding ``text``, removed after the test."""
    folder = f"/ratebeam-{uuid.uuid4().hex[:8]}"

    def write(name: str, text: str) -> str:
        url = f"memory://{folder}/{name}"
        with fsspec.open(url, "w") as fh:
            fh.write(text)
        return url

    yield write
    if fsspec.filesystem("memory").exists(folder):
        fsspec.filesystem("memory").rm(folder, recursive=True)
