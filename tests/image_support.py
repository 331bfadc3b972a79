"""The container test setup: podman configured for these machines, and base images made from Debian.

No container registry is reachable here, so neither ``python:3.11-slim`` nor a ``golang`` image can
be pulled.  The test builds its own two bases with ``mmdebstrap --variant=minbase`` from Debian's
packages and ``podman import``s them: a Python one (Debian's python3 3.11, its venv module,
ca-certificates, tini) and a Go one (ca-certificates plus this machine's Go toolchain copied in:
Debian's golang-go, 1.19, is older than Prism's go.mod asks for).  The Dockerfile builds Prism from
the Go module proxy in that Go base exactly as it would in ``golang:1.25-bookworm``.

Each base is cached as its mmdebstrap tarball under ``~/.cache/ratebeam/images``, keyed by a hash
of what it is made of (suite, packages, Go version), and imported only when podman does not
already have the tag: a machine handed back pays neither again.

podman itself (tests/servers/image_install.sh installs it) runs with ``runc`` and lowered
``default_ulimits``: the default ``crun`` and podman's default nofile above the hard limit refuse to
start containers on these machines.  The configuration is the test's own file (``CONTAINERS_CONF``),
the machine's ``/etc/containers`` is left alone.
"""

from __future__ import annotations

import hashlib
import os
import resource
import shutil
import subprocess
import time
from pathlib import Path

CACHE = Path.home() / ".cache" / "ratebeam"
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PYTHON_PACKAGES = ("python3", "python3-venv", "ca-certificates", "tini")
GO_PACKAGES = ("ca-certificates",)
#: Not in the bases: documentation and translations.
_EXCLUDED = ("--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-exclude=/usr/share/man/*",
             "--dpkgopt=path-exclude=/usr/share/locale/*")
TOOLS = ("podman", "runc", "mmdebstrap")


def missing_tools() -> list[str]:
    """The tools of tests/servers/image_install.sh that are not installed."""
    return [tool for tool in TOOLS if shutil.which(tool) is None]


def podman_env() -> dict[str, str]:
    """The environment for podman: this test's containers.conf (runc, ulimits within the hard limits)."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nofile = 1048576 if nofile == resource.RLIM_INFINITY else nofile
    conf = CACHE / "podman" / "containers.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    text = (f'[containers]\ndefault_ulimits = ["nofile={nofile}:{nofile}", "nproc=32768:32768"]\n'
            '[engine]\nruntime = "runc"\n')
    if not conf.exists() or conf.read_text() != text:
        conf.write_text(text)
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    """``podman args`` with the test's configuration; output captured."""
    done = subprocess.run(["podman", *args], env=podman_env(), capture_output=True, text=True, timeout=timeout,
                          check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args[:3])} ... exit {done.returncode}: {done.stderr[-3000:]}")
    return done


def python_base() -> str:
    """The Python base image's tag (made and cached on first use)."""
    return _base("python", PYTHON_PACKAGES, env=())


def go_base() -> str:
    """The Go builder base image's tag: Debian plus this machine's Go toolchain (made and cached on first use)."""
    goroot = subprocess.run(["go", "env", "GOROOT"], capture_output=True, text=True, check=True).stdout.strip()
    version = subprocess.run(["go", "version"], capture_output=True, text=True, check=True).stdout.strip()
    return _base("go", GO_PACKAGES, env=("PATH=/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",),
                 hook=f"copy-in {goroot} /usr/local", salt=version)


def _base(name: str, packages: tuple[str, ...], env: tuple[str, ...], hook: str = "", salt: str = "") -> str:
    key = hashlib.sha256(repr((SUITE, MIRROR, packages, _EXCLUDED, env, hook, salt)).encode()).hexdigest()[:12]
    tag = f"localhost/ratebeam-test-{name}-base:{key}"
    if podman("image", "exists", tag, check=False).returncode == 0:
        return tag
    tarball = CACHE / "images" / f"{name}-base-{key}.tar"
    if not tarball.exists():
        tarball.parent.mkdir(parents=True, exist_ok=True)
        partial = tarball.with_suffix(".partial.tar")
        command = ["mmdebstrap", "--variant=minbase", "--mode=root", "--quiet", f"--include={','.join(packages)}",
                   *_EXCLUDED, *([f"--customize-hook={hook}"] if hook else []), SUITE, str(partial), MIRROR]
        started = time.monotonic()
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False)
        if done.returncode != 0:
            partial.unlink(missing_ok=True)
            raise AssertionError(f"mmdebstrap of the {name} base failed: {done.stderr[-3000:]}")
        partial.rename(tarball)
        print(f"{name} base made by mmdebstrap in {time.monotonic() - started:.0f} s: {tarball}")
    changes = [arg for e in env for arg in ("--change", f"ENV {e}")]
    podman("import", *changes, str(tarball), tag, timeout=600)
    return tag
