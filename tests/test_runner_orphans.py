"""``ratebeam serve`` killed with SIGKILL leaves no runner process behind.

``serve --runner-config`` starts Prism (and, for an EXTERNAL environment without an endpoint, a
pool of SDK workers, which starts the worker processes) in sessions of their own.  Killed with
SIGKILL — its whole process group, or the ratebeam process alone — ratebeam used to leave them
running for good.  Every process started under ``serve`` carries a marker in its environment (all
of them inherit it), so the test finds them all in ``/proc`` whatever started them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml
from pipeline_support import NOW, RATEBEAM, setup_database, workspace
from servers.prism import prism_binary

from ratebeam.pipelines.runners.tethered import WATCH_SECONDS

MARK = "RATEBEAM_TEST_ORPHAN_MARK"
#: Seconds the runner processes have to die once ratebeam is gone.
GONE_SECONDS = 10 + WATCH_SECONDS


def marked(mark: str) -> dict[int, str]:
    """PID → command line of every live process whose environment carries ``MARK=mark``."""
    wanted = f"{MARK}={mark}".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if wanted not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            if (entry / "stat").read_text().rpartition(")")[2].split()[0] in ("Z", "X"):
                continue  # dead, not yet reaped
            found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:  # gone meanwhile, or not ours
            continue
    return found


def wait_for(condition, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    config = workspace(tmp_path_factory.mktemp("orphans") / "ws")
    setup_database(config)
    return config


@pytest.mark.parametrize(("environment", "kill"), [("LOOPBACK", "group"), ("EXTERNAL", "group"),
                                                   ("EXTERNAL", "alone")])
def test_a_killed_serve_leaves_no_runner_process(tmp_path, config, environment, kill):
    binary = prism_binary()
    if binary is None:
        pytest.skip("prism is not built: run tests/servers/prism_install.sh")
    runner = tmp_path / "prism.yaml"
    runner.write_text(yaml.safe_dump({"runner": "PortableRunner", "prism": {"binary": binary},
                                      "environment": {"type": environment}}))
    mark = uuid.uuid4().hex
    serve = subprocess.Popen(
        [*RATEBEAM, "serve", "-c", str(config), "--runner-config", str(runner), "--now", NOW, "--step", "3600",
         "--interval", "60", "--ticks", "1000"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, MARK: mark}, start_new_session=True)
    expected = [binary] + (["worker_pool_main", "ratebeam.pipelines.runners.sdk_worker"] if environment == "EXTERNAL" else [])
    try:
        wait_for(lambda: all(any(e in c for c in marked(mark).values()) for e in expected) or serve.poll() is not None,
                 f"serve to start {expected}", 120)
        assert serve.poll() is None, "serve ended early"
        if kill == "group":
            os.killpg(serve.pid, signal.SIGKILL)
        else:
            serve.send_signal(signal.SIGKILL)
        serve.wait(timeout=30)
        wait_for(lambda: not marked(mark), f"every runner process to die: {marked(mark)}", GONE_SECONDS)
    finally:
        if serve.poll() is None:
            os.killpg(serve.pid, signal.SIGKILL)
            serve.wait()
        for pid in marked(mark):  # what a failed test left: never leave it running
            os.kill(pid, signal.SIGKILL)
