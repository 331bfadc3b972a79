"""Whether a Dask scheduler answers at an address, asked before ratebeam's Dask runner connects to it.

A TCP connect alone succeeds on any listening port (the scheduler's dashboard, any HTTP server),
and ``distributed.Client(address, timeout=...)`` bounds its connect but then waits for the reply to
its registration without limit: so the launcher asks first, bounded here, and names whatever
answers instead (``runners.launch`` calls :func:`handshake` before it builds the runner).
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from ratebeam.pipelines.runners.launch import RunnerUnavailable

#: Seconds to wait for the first bytes of whatever listens where a scheduler should (to name it).
PROBE_SECONDS = 3.0


def handshake(address: str, timeout: int) -> None:
    """Refuse, in one line naming it, an ``address`` where no Dask scheduler says who it is within ``timeout`` s.

    A TCP connect alone succeeds on any listening port (the dashboard's, any HTTP server), and
    ``distributed.Client(address, timeout=...)`` bounds its connect but then waits for the reply
    to its registration without limit (tried: for ever, against an HTTP server).  So the scheduler
    is asked first, the whole exchange bounded here: Dask's comm handshake, then its ``identity``.
    """
    try:
        identity = asyncio.run(asyncio.wait_for(_identity(address, timeout), timeout))
    except Exception as exc:  # whatever the bytes that came back made of Dask's protocol: not a scheduler
        why = " ".join(str(exc).split())[:120] or type(exc).__name__
        raise RunnerUnavailable(f"no Dask scheduler at {address}: {what_answers(address)}; no Dask handshake "
                                f"within {timeout} s ({why})") from None
    kind = identity.get("type") if isinstance(identity, dict) else None
    if kind != "Scheduler":
        raise RunnerUnavailable(f"no Dask scheduler at {address}: a Dask {kind or 'peer'} answers there "
                                "(give the scheduler's address)")


async def _identity(address: str, timeout: int) -> Any:
    """The ``identity`` the Dask server at ``address`` gives (a scheduler: ``{"type": "Scheduler", ...}``)."""
    from distributed.comm import connect

    comm = await connect(address, timeout=timeout)
    try:
        await comm.write({"op": "identity", "n_workers": 0, "reply": True})
        return await comm.read()
    finally:
        comm.abort()


def what_answers(address: str) -> str:
    """What listens at a ``tcp://host:port`` address, said in a few words (an HTTP server by its status and name)."""
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_SECONDS) as sock:
            sock.settimeout(PROBE_SECONDS)
            sock.sendall(f"GET / HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
            answer = sock.recv(2048)
    except TimeoutError:
        return "something accepts connections there but says nothing"
    except OSError as exc:
        return f"nothing answers there: {exc.strerror or exc}"
    if not answer:
        return "something accepts connections there and closes them"
    lines = answer.decode("latin-1").split("\r\n")
    if lines[0].startswith("HTTP/"):
        server = next((line.split(":", 1)[1].strip() for line in lines if line.lower().startswith("server:")), None)
        return f"an HTTP server answers there ({lines[0]}{f', Server: {server}' if server else ''})"
    return f"something else answers there: {answer[:60]!r}"
