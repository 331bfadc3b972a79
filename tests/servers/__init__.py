"""Real servers for the integration tests, started on 127.0.0.1 by session fixtures.

A server that cannot be started makes its tests skip with the reason, except under ``CI=true``
where it makes them fail (a green CI must mean the servers were really there).
"""

from __future__ import annotations

import os

import pytest


def unavailable(reason: str) -> None:
    """Skip the test (fail it when ``CI=true``) because a server it needs is not there."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true and a required server is unavailable: {reason}", pytrace=False)
    pytest.skip(reason)
