"""A private PostgreSQL cluster for the tests: Debian's server, 127.0.0.1:15432, data under ``$RC/pg``.

``pg_url`` (session fixture) gives a fresh, empty database for the test session, or
``RATEBEAM_TEST_PG_URL`` as is when set.  The cluster (``${RATEBEAM_RC:-<repo>/.rc}/pg/data``, the
unix socket in ``$RC/pg``) is reused when something already answers on the port; else it is
created with ``initdb`` (as the ``postgres`` user when running as root: initdb refuses root) and
started.  Several pytest sessions may share it: each holds a shared lock on ``users.lock`` while
it runs, and the last one to finish stops the cluster if a test session started it (the
``started-by-tests`` marker) — a cluster started by someone else is never stopped.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from . import rc_dir, unavailable

HOST = "127.0.0.1"
PORT = 15432
USER = "postgres"
ENV_URL = "RATEBEAM_TEST_PG_URL"


class PgUnavailable(Exception):
    """PostgreSQL could not be found or started; the message says why."""


def _bin_dir() -> Path:
    candidates = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda path: int(path.parts[-3]) if path.parts[-3].isdigit() else 0,
    )
    if not candidates:
        raise PgUnavailable(
            "PostgreSQL server not installed (no /usr/lib/postgresql/*/bin/initdb): "
            "run tests/servers/install.sh"
        )
    return candidates[-1].parent


def _connect(dbname: str = "postgres"):
    import psycopg

    return psycopg.connect(host=HOST, port=PORT, user=USER, dbname=dbname, connect_timeout=3, autocommit=True)


def _ready() -> bool:
    try:
        import psycopg
    except ImportError as err:
        raise PgUnavailable(f"psycopg is not installed: {err}") from err
    try:
        _connect().close()
    except psycopg.OperationalError:
        return False
    return True


def _as_postgres(command: list[str]) -> list[str]:
    """Run ``command`` as the postgres user when we are root (initdb and postgres refuse root)."""
    if os.geteuid() != 0:
        return command
    if shutil.which("runuser"):
        return ["runuser", "-u", USER, "--", *command]
    return ["su", USER, "-s", "/bin/sh", "-c", " ".join(command)]


def _run(command: list[str], what: str, log: Path | None = None) -> None:
    try:
        done = subprocess.run(_as_postgres(command), capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise PgUnavailable(f"{what} failed: {err}") from err
    if done.returncode != 0:
        tail = log.read_text(errors="replace")[-1500:] if log is not None and log.exists() else ""
        raise PgUnavailable(f"{what} failed ({done.returncode}): {done.stderr.strip()[-1500:]} {tail}")


class Cluster:
    """The test cluster under ``<rc>/pg``: start on demand, share between sessions, stop when last."""

    def __init__(self, root: Path) -> None:
        self.root = root / "pg"
        self.data = self.root / "data"
        self.marker = self.root / "started-by-tests"
        self._users_fd: int | None = None

    @contextmanager
    def _setup_lock(self) -> Iterator[None]:
        fd = os.open(self.root / "setup.lock", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _prepare_dir(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.root, USER)
            for parent in (self.root.parent, *self.root.parent.parents):
                if not os.stat(parent).st_mode & 0o001:
                    raise PgUnavailable(f"the postgres user cannot enter {parent} (mode without o+x)")

    def _start(self) -> None:
        bin_dir = _bin_dir()
        log = self.root / "pg.log"
        if not (self.data / "PG_VERSION").exists():
            _run([str(bin_dir / "initdb"), "-D", str(self.data), "-A", "trust", "-U", USER, "-E", "UTF8",
                  "--no-sync"], "initdb")
        options = f"-c listen_addresses={HOST} -p {PORT} -k {self.root} -c fsync=off"
        _run([str(bin_dir / "pg_ctl"), "-D", str(self.data), "-o", options, "-l", str(log), "-w", "-t", "60",
              "start"], "pg_ctl start", log)
        if not _ready():
            raise PgUnavailable(f"PostgreSQL started but does not answer on {HOST}:{PORT}; see {log}")
        self.marker.write_text(f"{os.getpid()}\n")

    def join(self) -> None:
        """Make sure the cluster runs and register this session as a user of it."""
        self._prepare_dir()
        with self._setup_lock():
            if not _ready():
                self._start()
            self._users_fd = os.open(self.root / "users.lock", os.O_CREAT | os.O_RDWR, 0o644)
            fcntl.flock(self._users_fd, fcntl.LOCK_SH)

    def leave(self) -> None:
        """Unregister; the last user stops the cluster if a test session started it."""
        if self._users_fd is None:
            return
        with self._setup_lock():
            try:
                fcntl.flock(self._users_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # another session still uses it
            finally:
                os.close(self._users_fd)
                self._users_fd = None
            if self.marker.exists():
                _run([str(_bin_dir() / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"], "pg_ctl stop")
                self.marker.unlink()


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A SQLAlchemy url (``postgresql+psycopg://``) of an empty database for this test session."""
    if os.environ.get(ENV_URL):
        url = os.environ[ENV_URL]
        try:
            import psycopg
            from sqlalchemy.engine import make_url

            conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
            psycopg.connect(conninfo, connect_timeout=5).close()
        except Exception as err:
            unavailable(f"{ENV_URL} is set but its database does not answer: {err}")
        yield url
        return
    cluster = Cluster(rc_dir())
    try:
        cluster.join()
    except PgUnavailable as err:
        unavailable(str(err))
    name = f"ratebeam_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    try:
        with _connect() as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        yield f"postgresql+psycopg://{USER}@{HOST}:{PORT}/{name}"
    finally:
        try:
            with _connect() as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            cluster.leave()
