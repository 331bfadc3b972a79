"""The optional extras of ``pyproject.toml``, and the one refusal when the package of one is missing.

Why one place: a package an extra brings that is not installed is a configuration mistake the user
fixes with one command, so it must be refused like any bad input — exit 2, one line naming the key
or option that needs it and ``pip install 'ratebeam[<extra>]'`` — and never reach the CLI's last
resort as an ``ImportError`` (exit 70, "a bug").  Connectors, commands and runner configurations
all call :func:`require_extra` (or :func:`missing_package` where an import already failed), so the
message is the same wherever it happens.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any, NamedTuple

import fsspec

from ratebeam.connectors.errors import FatalConnectorError


class Extra(NamedTuple):
    """What an extra brings: the module ratebeam imports and the package ``pip`` installs."""

    module: str
    package: str


#: Each optional extra whose code ratebeam imports only when a configuration or option asks for it.
EXTRAS: dict[str, Extra] = {
    "s3": Extra("s3fs", "s3fs"),
    "postgresql": Extra("psycopg", "psycopg"),
    "cloudkitty-rpc": Extra("oslo_messaging", "oslo.messaging"),
    "openstack": Extra("keystoneauth1", "keystoneauth1"),
    "service": Extra("prometheus_client", "prometheus-client"),
    "chart": Extra("matplotlib", "matplotlib"),
    "dask": Extra("distributed", "dask[distributed]"),
    "events": Extra("kombu", "kombu"),
}


class MissingExtra(FatalConnectorError):
    """``where`` needs the package of ``extra``, which is not installed (a fatal configuration error)."""

    def __init__(self, where: str, extra: str, error: ImportError) -> None:
        self.extra = extra
        brings, missing = EXTRAS[extra], _missing_module(error)
        detail = "" if missing.partition(".")[0] == brings.module else f" ({missing} is missing)"  # a dependency of the package
        super().__init__(f"{where} needs {brings.package}, which is not installed{detail}: "
                         f"pip install 'ratebeam[{extra}]'")


def require_extra(extra: str, where: str, module: str | None = None) -> ModuleType:
    """``module`` (default: the extra's own), imported; ``MissingExtra`` naming ``where`` if it cannot be.

    ``where`` says what asked for it, as the user wrote it: a key (``collector.url 's3://b/u/'``),
    an option (``--metrics-port``) or a command (``report chart``).
    """
    try:
        return importlib.import_module(module or EXTRAS[extra].module)
    except ImportError as exc:
        raise MissingExtra(where, extra, exc) from None


def missing_package(where: str, error: ImportError) -> FatalConnectorError:
    """The refusal of an import that failed: ``MissingExtra`` when an extra brings the missing module."""
    top = _missing_module(error).partition(".")[0]
    for extra, brings in EXTRAS.items():
        if brings.module == top:
            return MissingExtra(where, extra, error)
    return FatalConnectorError(f"{where} needs a package that is not installed ({error})")


def url_to_fs(url: str, where: str, **storage_options: Any) -> tuple[Any, str]:
    """``fsspec.core.url_to_fs``, with a filesystem package that is not installed refused naming ``where``.

    fsspec re-raises the failed import as a bare ``ImportError("Install s3fs to access S3")``; the
    module that is missing is that error's cause.
    """
    try:
        fs, path = fsspec.core.url_to_fs(url, **storage_options)
    except ImportError as exc:
        cause = exc.__cause__ if isinstance(exc.__cause__, ImportError) else exc
        raise missing_package(f"{where} {url!r}", cause) from None
    return fs, path


def _missing_module(error: ImportError) -> str:
    return error.name or str(error)
