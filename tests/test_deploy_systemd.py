"""deploy/systemd: the units pass ``systemd-analyze verify``, their commands parse, ``sd_notify`` speaks the protocol.

``systemd-analyze verify`` (systemd's own checker; it needs no running systemd) is run on a copy of
the units whose ``ExecStart=`` points at this environment's ``ratebeam`` (it checks that the
command exists); any warning counts as a failure.  Each ``ExecStart`` is parsed by ratebeam's own
argument parser, so a unit cannot name an option ratebeam does not have.  The notify side is tested
on a real datagram socket, as systemd's ``$NOTIFY_SOCKET`` is one.
"""

from __future__ import annotations

import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from servers import unavailable

from ratebeam.pipelines.cli import build_parser
from ratebeam.pipelines.ops.health import ServiceMonitor

UNITS = Path(__file__).resolve().parents[1] / "deploy" / "systemd"
INSTALLED = "/usr/local/bin/ratebeam"


def test_the_units_pass_systemd_analyze_verify(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        unavailable("systemd-analyze is not installed (Debian: systemd)")
    ratebeam = Path(sys.executable).with_name("ratebeam")
    assert ratebeam.exists()
    units = sorted(UNITS.glob("ratebeam-*"))
    assert {u.name for u in units} == {
        "ratebeam-db-upgrade.service", "ratebeam-serve.service", "ratebeam-events.service", "ratebeam-rpc.service",
        "ratebeam-run.service", "ratebeam-run.timer"}
    for unit in units:
        (tmp_path / unit.name).write_text(unit.read_text().replace(INSTALLED, str(ratebeam)))
    done = subprocess.run([analyze, "verify", "--man=no", *sorted(str(p) for p in tmp_path.iterdir())],
                          capture_output=True, text=True, check=False, cwd=tmp_path)
    assert done.returncode == 0 and not done.stderr.strip() and not done.stdout.strip(), done.stderr + done.stdout


def test_verify_fails_on_a_wrong_directive(tmp_path):
    """The check above can fail: a misspelt directive is a warning, which the test counts."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        unavailable("systemd-analyze is not installed (Debian: systemd)")
    unit = tmp_path / "ratebeam-db-upgrade.service"
    unit.write_text((UNITS / unit.name).read_text().replace(INSTALLED, sys.executable)
                    .replace("RemainAfterExit=yes", "RemainAfterExits=yes"))
    done = subprocess.run([analyze, "verify", "--man=no", str(unit)], capture_output=True, text=True, check=False)
    assert "RemainAfterExits" in done.stderr


@pytest.mark.parametrize("unit", sorted(p.name for p in UNITS.glob("*.service")))
def test_each_exec_start_is_a_command_ratebeam_takes(unit):
    lines = [line for line in (UNITS / unit).read_text().splitlines() if line.startswith("ExecStart=")]
    assert len(lines) == 1
    argv = shlex.split(lines[0].removeprefix("ExecStart="))
    assert argv[0] == INSTALLED
    args = build_parser().parse_args(argv[1:])  # exits 2 on an unknown option
    assert callable(args.func)


def test_sd_notify_ready_once_the_checks_pass_then_watchdog_then_stopping(tmp_path, monkeypatch):
    address = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as manager:
        manager.bind(address)
        manager.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", address)
        monitor = ServiceMonitor("test")
        up = {"database": False}

        def database() -> None:
            if not up["database"]:
                raise RuntimeError("database down")

        monitor.add_check("database", database)
        monitor.beat()  # not ready: nothing said
        up["database"] = True
        monitor.beat()
        monitor.beat()
        monitor.close()
        said = [manager.recv(100).decode() for _ in range(3)]
    assert said == ["READY=1", "WATCHDOG=1", "STOPPING=1"]
