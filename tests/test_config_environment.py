"""Configuration from the environment and from secret files, and ``ratebeam config check``.

Every key of ``ratebeam.yaml`` can be set by ``RATEBEAM_<KEY>`` (nested with ``__``), every secret
read from a file (``<key>_file:`` or ``RATEBEAM_<KEY>_FILE``, relative to ``$CREDENTIALS_DIRECTORY``
under systemd); ``config check`` shows the effective values, secrets masked, with their origin.
The database secret is a real PostgreSQL role's URL: ``db upgrade`` and ``config check --connect`` log in with it.
"""

from __future__ import annotations

import json
import uuid

import pytest
import sqlalchemy as sa
import yaml
from pipeline_support import ratebeam, workspace
from servers.postgres import pg_url  # noqa: F401  (session fixture)
from sqlalchemy.engine import make_url

from ratebeam.connectors.sql.engine import make_engine
from ratebeam.pipelines.config import load_config, load_layered
from ratebeam.pipelines.errors import InputError

PASSWORD = "s3cr3t-from-a-file"


@pytest.fixture
def config(tmp_path):
    return workspace(tmp_path / "ws")


def test_a_nested_key_and_a_list_item_from_the_environment(config, monkeypatch):
    monkeypatch.setenv("RATEBEAM_PERIOD", "1800")
    monkeypatch.setenv("RATEBEAM_MAX_PERIODS_PER_RUN", "12")
    monkeypatch.setenv("RATEBEAM_STORAGE__BACKENDS__0__URL", "elsewhere/")
    monkeypatch.setenv("RATEBEAM_RC", "/not/a/key")  # another RATEBEAM_ variable is not taken for a key
    loaded, layered = load_layered(config)
    assert loaded.period == 1800 and loaded.max_periods_per_run == 12
    assert str(loaded.storage[0].url).endswith("elsewhere/")
    assert layered.origin(("period",)) == "env RATEBEAM_PERIOD"
    assert layered.origin(("storage", "backends", 0, "url")) == "env RATEBEAM_STORAGE__BACKENDS__0__URL"
    assert layered.origin(("scope_key",)).startswith("file ")


def test_a_bad_value_from_the_environment_names_the_variable(config, monkeypatch):
    monkeypatch.setenv("RATEBEAM_PERIOD", "-5")
    with pytest.raises(InputError) as caught:
        load_config(config)
    assert str(caught.value).startswith("environment: RATEBEAM_PERIOD: ")
    done = ratebeam("config", "check", "-c", str(config), env={"RATEBEAM_PERIOD": "-5"})
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "RATEBEAM_PERIOD" in done.stderr and "Traceback" not in done.stderr


def _secret_role(pg_url: str) -> str:  # noqa: F811
    """A login role with PASSWORD in the test database; its URL with the password."""
    import psycopg

    role = f"rb_{uuid.uuid4().hex[:8]}"
    url = make_url(pg_url)
    admin = url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{PASSWORD}'")
        conn.execute(f'GRANT ALL ON DATABASE "{url.database}" TO {role}')
        conn.execute(f"GRANT ALL ON SCHEMA public TO {role}")
    return url.set(username=role, password=PASSWORD).render_as_string(hide_password=False)


def test_the_database_url_from_a_secret_file_logs_in_and_is_masked(config, pg_url, tmp_path, monkeypatch):  # noqa: F811
    """``RATEBEAM_DATABASE_URL_FILE`` (a relative name, found in ``$CREDENTIALS_DIRECTORY`` as systemd
    sets it): ``db upgrade`` and ``config check --connect`` log in with it; the check masks it."""
    url = _secret_role(pg_url)
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    (credentials / "database_url").write_text(url + "\n")  # a file's trailing newline is not the secret's
    env = {"RATEBEAM_DATABASE_URL_FILE": "database_url", "CREDENTIALS_DIRECTORY": str(credentials)}
    upgraded = ratebeam("db", "upgrade", "-c", str(config), env=env)
    assert upgraded.returncode == 0, upgraded.stderr
    done = ratebeam("config", "check", "-c", str(config), "--connect", env=env)
    assert done.returncode == 0, done.stderr
    assert PASSWORD not in done.stdout + done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith("database_url = "))
    assert ":***@" in line
    assert f"# secret file {credentials / 'database_url'} (env RATEBEAM_DATABASE_URL_FILE)" in line
    assert "connect: database ok" in done.stdout
    # The test cluster trusts 127.0.0.1, so the login alone does not prove the password: the model holds
    # it, exactly (the trailing newline dropped), and the database saw the secret file's role.
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    loaded = load_config(config)
    assert make_url(loaded.database_url).password == PASSWORD
    with make_engine(loaded.database_url).connect() as conn:
        assert conn.execute(sa.text("SELECT current_user")).scalar_one() == make_url(url).username


def test_a_password_file_key_in_the_yaml_and_a_secret_from_the_environment_are_masked(config, tmp_path):
    """``password_file:`` in the YAML (relative to it) and ``RATEBEAM_..._TOKEN`` in the environment:
    both reach the model, neither is printed; each line says where its value came from."""
    doc = yaml.safe_load(config.read_text())
    doc["storage"]["backends"].append({"backend": "influxdb", "url": "http://127.0.0.1:8086", "version": 1,
                                       "username": "u", "password_file": "influx.secret"})
    doc["storage"]["backends"].append({"backend": "influxdb", "url": "http://127.0.0.1:8086", "version": 2,
                                       "token": "placeholder"})
    config.write_text(yaml.safe_dump(doc))
    (config.parent / "influx.secret").write_text("influx-pass\n")
    env = {"RATEBEAM_STORAGE__BACKENDS__2__TOKEN": "token-from-env"}
    done = ratebeam("config", "check", "-c", str(config), "--json", env=env)
    assert done.returncode == 0, done.stderr
    keys = json.loads(done.stdout)["keys"]
    assert keys["storage.backends[1].password"] == {
        "value": "***", "origin": f"secret file {config.parent / 'influx.secret'} (file {config})"}
    assert keys["storage.backends[2].token"] == {"value": "***", "origin": "env RATEBEAM_STORAGE__BACKENDS__2__TOKEN"}
    assert keys["storage.backends[1].retries"]["origin"] == "default"
    assert "influx-pass" not in done.stdout and "token-from-env" not in done.stdout


def test_the_model_gets_the_secret_files_content(config, tmp_path, monkeypatch):
    doc = yaml.safe_load(config.read_text())
    doc["storage"]["backends"].append({"backend": "influxdb", "url": "http://127.0.0.1:8086", "version": 1,
                                       "username": "u", "password_file": "influx.secret"})
    config.write_text(yaml.safe_dump(doc))
    (config.parent / "influx.secret").write_text("influx-pass\r\n")
    assert load_config(config).storage[1].password == "influx-pass"
    monkeypatch.setenv("RATEBEAM_STORAGE__BACKENDS__1__PASSWORD_FILE", str(tmp_path / "missing"))
    with pytest.raises(InputError) as caught:
        load_config(config)
    assert str(caught.value) == (f"environment: RATEBEAM_STORAGE__BACKENDS__1__PASSWORD_FILE: cannot read the secret "
                                 f"file: No such file or directory: '{tmp_path / 'missing'}'")


def test_a_missing_secret_file_is_one_line_and_exit_2(config):
    doc = yaml.safe_load(config.read_text())
    doc["database_url_file"] = "nowhere/db.secret"
    config.write_text(yaml.safe_dump(doc))
    both = ratebeam("config", "check", "-c", str(config))
    assert both.returncode == 2
    assert both.stderr == f"ratebeam: {config}: database_url_file: give database_url or database_url_file, not both\n"
    del doc["database_url"]
    config.write_text(yaml.safe_dump(doc))
    done = ratebeam("config", "check", "-c", str(config))
    assert done.returncode == 2
    assert done.stderr == (f"ratebeam: {config}: database_url_file: cannot read the secret file: No such file or "
                           f"directory: '{config.parent / 'nowhere/db.secret'}'\n")


def test_config_check_connects_to_nothing_unless_asked(config):
    """A database that cannot answer (a port nothing listens on): the check passes, ``--connect`` fails."""
    from servers import free_port

    env = {"RATEBEAM_DATABASE_URL": f"postgresql+psycopg://u:p@127.0.0.1:{free_port()}/x"}
    done = ratebeam("config", "check", "-c", str(config), env=env)
    assert done.returncode == 0, done.stderr
    assert "loaded " in done.stdout and "metric(s)" in done.stdout
    connected = ratebeam("config", "check", "-c", str(config), "--connect", env=env)
    assert connected.returncode != 0 and connected.stderr.startswith("ratebeam: ")
    assert ":p@" not in connected.stderr
