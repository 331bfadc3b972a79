"""``prism: {binary: auto}`` finds Prism the way Beam's ``PrismRunner`` does.

The order: ``prism`` on PATH, else ``$RATEBEAM_PRISM_BINARY`` (what ratebeam's container image
sets), else Beam's own release binary of its version in Beam's cache
(``~/.apache_beam/cache/prism/bin``), fetched by Beam once.  When the fetch fails the run stops
with one line naming all three ways, exit 2.

The Prism started is the real one built by ``tests/servers/prism_install.sh``.  Beam's download
is from GitHub's release pages: the failure is made certain on any machine by an HTTPS proxy that
refuses connections (Beam's ``urlopen`` honours ``HTTPS_PROXY``) and a fresh ``HOME`` (an empty
Beam cache); the cache hit is Beam's own zip layout in that ``HOME``, which Beam unzips itself.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml
from pipeline_support import NOW as DEMO_NOW
from pipeline_support import RATEBEAM, setup_database, stored_rows, workspace
from servers import free_port, unavailable
from servers.prism import prism_binary

from ratebeam.pipelines.runners.launch import (
    PRISM_ENV,
    PRISM_INSTALL,
    PRISM_VERSION,
    _prism_binary,
    prism_job_server,
)

RESOLVE = ("import sys; from ratebeam.pipelines.runners.launch import _prism_binary, prism_job_server\n"
           "binary = _prism_binary('auto')\n"
           "with prism_job_server(binary) as endpoint: print(binary, endpoint)\n")


def built_prism() -> str:
    binary = prism_binary()
    if binary is None:
        unavailable("prism is not built: run tests/servers/prism_install.sh")
    return binary


def offline_env(home: Path) -> dict[str, str]:
    """No prism on PATH, no image variable, an empty Beam cache, and a proxy that refuses GitHub."""
    env = {k: v for k, v in os.environ.items() if k != PRISM_ENV and k.lower() not in ("no_proxy",)}
    dead = f"http://127.0.0.1:{free_port()}"
    env.update(HOME=str(home), PATH=str(Path(sys.executable).parent), HTTPS_PROXY=dead, https_proxy=dead)
    return env


def test_auto_without_any_prism_stops_in_one_line_naming_the_three_ways(tmp_path):
    config = workspace(tmp_path / "ws")
    setup_database(config)
    runner = tmp_path / "runner.yaml"
    runner.write_text(yaml.safe_dump({"runner": "PortableRunner", "prism": {"binary": "auto"},
                                      "environment": {"type": "LOOPBACK"}}))
    home = tmp_path / "home"
    home.mkdir()
    done = subprocess.run([*RATEBEAM, "run", "-c", str(config), "--now", DEMO_NOW, "--runner-config", str(runner)],
                          capture_output=True, text=True, timeout=300, env=offline_env(home), cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("ratebeam: ")]
    assert len(lines) == 1, done.stderr[-3000:]
    line = lines[0]
    cache = home / ".apache_beam" / "cache" / "prism" / "bin"
    for way in ("no 'prism' on PATH", f"{PRISM_ENV} is not set",
                f"Beam could not fetch Prism v{PRISM_VERSION} into its cache {cache}", PRISM_INSTALL):
        assert way in line, (way, line)
    assert stored_rows(config).height == 0


def test_auto_takes_the_image_prism_when_none_is_on_path(monkeypatch):
    binary = built_prism()
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    monkeypatch.setenv(PRISM_ENV, binary)
    assert _prism_binary("auto") == binary
    with prism_job_server(_prism_binary("auto")) as endpoint:
        assert endpoint.startswith("localhost:")


def test_prism_on_path_comes_before_the_image_prism(tmp_path, monkeypatch):
    binary = built_prism()
    monkeypatch.setenv("PATH", f"{Path(binary).parent}{os.pathsep}{Path(sys.executable).parent}")
    monkeypatch.setenv(PRISM_ENV, str(tmp_path / "not-this-one"))
    assert _prism_binary("auto") == binary


def test_an_image_prism_that_is_not_executable_is_named(tmp_path):
    env = offline_env(tmp_path)
    env[PRISM_ENV] = str(tmp_path / "no-prism-here")
    done = subprocess.run([sys.executable, "-c", RESOLVE], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 1
    assert f"Prism not found: {PRISM_ENV}={tmp_path / 'no-prism-here'} is not an executable file" in done.stderr


def test_auto_falls_back_to_beams_release_binary_in_beams_cache(tmp_path):
    """Beam's cache holds the release zip of ratebeam's Prism version (as its download leaves it): Beam unzips it
    and that binary is started, without the network."""
    binary = built_prism()
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    name = f"apache_beam-v{PRISM_VERSION}-prism-{platform.system().lower()}-{arch}"
    cache = tmp_path / ".apache_beam" / "cache" / "prism" / "bin"
    cache.mkdir(parents=True)
    with zipfile.ZipFile(cache / f"{name}.zip", "w") as release:
        release.write(binary, name)
    done = subprocess.run([sys.executable, "-c", RESOLVE], capture_output=True, text=True, timeout=120,
                          env=offline_env(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    started, endpoint = done.stdout.split()
    assert started == str(cache / name) and endpoint.startswith("localhost:")
    assert os.access(started, os.X_OK)


@pytest.fixture(autouse=True)
def _no_image_prism(monkeypatch):
    monkeypatch.delenv(PRISM_ENV, raising=False)
