"""A private SeaweedFS server with its S3 gateway, for the ``s3://`` storage tests, on free 127.0.0.1 ports.

SeaweedFS (Apache-2.0), built by ``tests/servers/seaweedfs_install.sh`` under ``$RC/seaweedfs``,
serves the S3 API (bucket creation, multipart uploads, conditional ``If-None-Match`` puts, which
delta-rs's commits rely on for concurrent writers).  No identity is configured, so any access key is
accepted.  Each test gets its own bucket (``bucket()``).  Missing: the tests skip with the reason
(fail under CI=true).
"""

from __future__ import annotations

import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from . import free_port, installed, stop, unavailable

HOST = "127.0.0.1"


@dataclass(frozen=True)
class S3Server:
    """A running S3 endpoint: ``storage_options`` are delta-rs's keys for it."""

    endpoint: str

    @property
    def storage_options(self) -> dict[str, str]:
        """The ``storage_options`` of a delta backend on this endpoint (plain HTTP, any key)."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ALLOW_HTTP": "true", "AWS_REGION": "us-east-1",
                "AWS_ACCESS_KEY_ID": "ratebeam", "AWS_SECRET_ACCESS_KEY": "ratebeam-secret"}

    def bucket(self) -> str:
        """A new empty bucket's name."""
        name = f"rb-{uuid.uuid4().hex[:12]}"
        requests.put(f"{self.endpoint}/{name}", timeout=30).raise_for_status()
        return name

    def keys(self, bucket: str) -> list[str]:
        """Every object key of ``bucket`` (S3's ListObjectsV2, first 1,000)."""
        answer = requests.get(f"{self.endpoint}/{bucket}", params={"list-type": "2"}, timeout=30)
        answer.raise_for_status()
        import xml.etree.ElementTree as ET

        root = ET.fromstring(answer.content)
        return sorted(e.text or "" for e in root.iter() if e.tag.endswith("}Key"))


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """SeaweedFS's S3 gateway for the session (skipped with the reason when it is not built)."""
    program = installed("seaweedfs/weed")
    if program is None:
        unavailable("SeaweedFS is not built: run tests/servers/seaweedfs_install.sh")
    root = Path(tempfile.mkdtemp(prefix="ratebeam-seaweedfs-"))
    ports = {name: free_port() for name in ("master", "volume", "filer", "s3")}
    grpc = {name: free_port() for name in ports}
    args = [program, "server", f"-ip={HOST}", f"-ip.bind={HOST}", f"-dir={root}", "-volume.max=0",
            "-master.volumeSizeLimitMB=64", "-s3", "-s3.port.iceberg=0", "-s3.port.lance=0",
            *(f"-{name}.port={port}" for name, port in ports.items()),
            *(f"-{name}.port.grpc={port}" for name, port in grpc.items())]
    with (root / "weed.log").open("w") as log:
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    endpoint = f"http://{HOST}:{ports['s3']}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:  # ready once a bucket can be made and written to (the volume server is up)
                probe = f"{endpoint}/ready-{uuid.uuid4().hex[:8]}"
                if requests.put(probe, timeout=2).ok and requests.put(f"{probe}/x", data=b"x", timeout=5).ok:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline or process.poll() is not None:
                unavailable(f"SeaweedFS's S3 gateway did not answer on {endpoint}: "
                            f"{(root / 'weed.log').read_text()[-1500:]}")
            time.sleep(0.3)
        yield S3Server(endpoint)
    finally:
        stop(process, root, grace=2)  # it lingers ~15 s on SIGTERM; its data is scratch
