"""``ratebeam.yaml`` layered with the environment and secret files, each value's origin kept.

Why: a container or a unit file sets its configuration with environment variables, and its
secrets come as files (Kubernetes Secrets mounted as volumes, systemd credentials under
``$CREDENTIALS_DIRECTORY``, Docker secrets under ``/run/secrets``), never written in clear into a
YAML file that lives in a ConfigMap or a repository.  Three layers, the later winning:

1. ``ratebeam.yaml`` as written;
2. ``RATEBEAM_<KEY>`` environment variables, nested with ``__`` (``RATEBEAM_DATABASE_URL``,
   ``RATEBEAM_COLLECTOR__URL``, ``RATEBEAM_STORAGE__BACKENDS__0__TOKEN``: a number is a list
   index), read by pydantic-settings' own environment source (the models' library).  A value is
   read as a YAML scalar (``3600`` is a number, ``true`` a boolean), except a secret's or a URL's,
   which is always text;
3. secret files: a key ``<secret>_file: PATH`` in the YAML, or ``RATEBEAM_<KEY>_FILE=PATH``, sets
   ``<secret>`` to the file's content (one trailing newline dropped).  A relative path from the
   environment is looked up in ``$CREDENTIALS_DIRECTORY`` when systemd set it; one from the YAML
   is relative to the YAML's directory, as every other path there.

A secret is a key named in :data:`SECRET_KEYS` or ending in ``_url`` (URLs may carry a password).
The result is plain data, validated afterwards by the same models as the YAML alone, so a value
from the environment is checked exactly as one from the file; :func:`origins` says where each
leaf came from, for ``ratebeam config check``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import create_model
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsConfigDict

from ratebeam.pipelines.errors import InputError

PREFIX = "RATEBEAM_"
DELIMITER = "__"
FILE_SUFFIX = "_file"
#: Keys whose values are secrets wherever they are (besides every ``*_url``).
SECRET_KEYS = frozenset({
    "password", "token", "bearer_token", "application_credential_secret", "secret", "secret_key",
    "access_key", "key", "aws_secret_access_key",
})
MASK = "***"
#: The top-level keys whose value is a mapping (their nested keys are set with ``__``).
SECTIONS = frozenset({"fetcher", "collector", "storage", "events"})
#: The password of a URL's user info (``scheme://user:PASSWORD@host``).
_URL_PASSWORD = re.compile(r"(?P<head>[a-zA-Z][a-zA-Z0-9+.\-]*://[^:/@\s]*:)[^@/\s]*(?=@)")

KeyPath = tuple[str | int, ...]


def is_secret(key: str | int) -> bool:
    """Whether the value of ``key`` is a secret (masked when shown, readable from a file)."""
    return isinstance(key, str) and (key in SECRET_KEYS or key == "url" or key.endswith("_url"))


def masked(key: str | int, value: Any) -> Any:
    """``value`` as it may be shown: a secret key's value hidden, any URL's password hidden."""
    if isinstance(value, str):
        if isinstance(key, str) and key in SECRET_KEYS:
            return MASK
        return _URL_PASSWORD.sub(rf"\g<head>{MASK}", value)
    return value


def dotted(path: KeyPath) -> str:
    """``("storage", "backends", 0, "url")`` as ``storage.backends[0].url`` (the validation errors' form)."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def env_name(path: KeyPath) -> str:
    """The environment variable of a key path: ``RATEBEAM_STORAGE__BACKENDS__0__URL``."""
    return PREFIX + DELIMITER.join(str(p).upper() for p in path)


def leaves(data: Any, path: KeyPath = ()) -> Iterator[tuple[KeyPath, Any]]:
    """Every (key path, value) of the scalars and empty containers under ``data``."""
    if isinstance(data, dict) and data:
        for key, value in data.items():
            yield from leaves(value, (*path, key))
    elif isinstance(data, list) and data:
        for index, value in enumerate(data):
            yield from leaves(value, (*path, index))
    else:
        yield path, data


class Layered:
    """The configuration data after the three layers, and where each leaf came from."""

    def __init__(self, data: dict[str, Any], origins: dict[KeyPath, str]) -> None:
        self.data = data
        self.origins = origins

    def origin(self, path: KeyPath) -> str:
        """Where the value at ``path`` came from: ``file …``, ``env …``, ``secret file …``, else ``default``."""
        for n in range(len(path), 0, -1):  # a whole section set at once (one variable) is the origin of its keys
            if path[:n] in self.origins:
                return self.origins[path[:n]]
        return "default"


def layer(data: Any, source: str, keys: tuple[str, ...], base: Path,
          environ: Mapping[str, str] | None = None) -> Layered:
    """``data`` (the YAML as read from ``source``) with the environment's overrides and the secret files read.

    ``keys`` are the file's top-level keys (the only variables read); ``base`` the YAML's directory.
    """
    environ = os.environ if environ is None else environ
    if not isinstance(data, dict):
        return Layered(data, {})  # not a mapping: the model's own error says so
    data = _copy(data)
    origins: dict[KeyPath, str] = {path: f"file {source}" for path, _ in leaves(data)}
    for path, text in leaves(_from_environment(keys, environ)):
        if not isinstance(text, str):
            continue
        path = _set(data, path, text if is_secret(path[-1]) else _scalar(path, text))
        for known in [p for p in origins if p[:len(path)] == path]:
            del origins[known]
        origins[path] = f"env {env_name(path)}"
    _read_secret_files(data, (), origins, source, base, environ)
    return Layered(data, origins)


def _from_environment(keys: tuple[str, ...], environ: Mapping[str, str]) -> dict[str, Any]:
    """The ``RATEBEAM_*`` variables of the file's keys (and their ``_FILE`` forms), as nested data.

    pydantic-settings' ``EnvSettingsSource`` explodes ``__`` into nested mappings; the model it
    reads for is made of the file's top-level keys, so another ``RATEBEAM_*`` variable (the CLI's
    ``RATEBEAM_CONFIG``, ``RATEBEAM_LOG_LEVEL``...) is never taken for a key.
    """
    # A section (a mapping in the file) is "complex" to pydantic-settings: its ``__`` variables are exploded.
    fields: dict[str, Any] = {key: (dict[str, Any] | None if key in SECTIONS else str | None, None) for key in keys}
    fields.update({key + FILE_SUFFIX: (str | None, None) for key in keys if is_secret(key)})
    settings = create_model("RatebeamEnvironment", __base__=BaseSettings, **fields)
    settings.model_config = SettingsConfigDict(env_prefix=PREFIX, env_nested_delimiter=DELIMITER,
                                               case_sensitive=False, extra="ignore")
    source = EnvSettingsSource(settings, env_prefix=PREFIX, env_nested_delimiter=DELIMITER, case_sensitive=False)
    source.env_vars = {k.lower(): v for k, v in environ.items() if k.upper().startswith(PREFIX)}
    return {k: v for k, v in source().items() if v is not None}


def _scalar(path: KeyPath, text: str) -> Any:
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        raise InputError("environment", env_name(path), "not a YAML value", text) from None
    return text if value is None and text else value


def _copy(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _copy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_copy(v) for v in data]
    return data


def _set(data: dict[str, Any], path: KeyPath, value: Any) -> KeyPath:
    """Put ``value`` at ``path``, making mappings on the way; a digit key indexes a list that is there.

    Returns the path as the data has it (list indexes as numbers).
    """
    node: Any = data
    done: list[str | int] = []
    for n, part in enumerate(path):
        last = n == len(path) - 1
        if isinstance(node, list):
            if not (isinstance(part, str) and part.isdigit() and int(part) < len(node)):
                raise InputError("environment", env_name(path[:n + 1]),
                                 f"no such list item (the list has {len(node)})")
            index: Any = int(part)
        elif isinstance(node, dict):
            index = part
        else:
            raise InputError("environment", env_name(path), f"{dotted(path[:n])} is not a mapping in the file")
        done.append(index)
        if last:
            node[index] = value
        else:
            if not isinstance(node, list) and index not in node:
                node[index] = {}
            node = node[index]
    return tuple(done)


def _read_secret_files(node: Any, path: KeyPath, origins: dict[KeyPath, str], source: str, base: Path,
                       environ: Mapping[str, str]) -> None:
    """Replace each ``<secret>_file: PATH`` under ``node`` with ``<secret>: <the file's content>``."""
    items = list(node.items()) if isinstance(node, dict) else list(enumerate(node)) if isinstance(node, list) else []
    for key, value in items:
        if isinstance(node, list):
            _read_secret_files(value, (*path, key), origins, source, base, environ)
            continue
        if not (isinstance(key, str) and key.endswith(FILE_SUFFIX) and is_secret(key[:-len(FILE_SUFFIX)])):
            _read_secret_files(value, (*path, key), origins, source, base, environ)
            continue
        target = key[:-len(FILE_SUFFIX)]
        at = (*path, key)
        told = origins.pop(at, f"file {source}")
        from_env = told.startswith("env")
        where = ("environment", env_name(at)) if from_env else (source, dotted(at))
        if target in node and not (from_env and origins.get((*path, target), "").startswith("file ")):
            raise InputError(*where, f"give {target} or {key}, not both")  # in one layer: which is meant?
        if not isinstance(value, str) or not value:
            raise InputError(*where, "expected the path of a file")
        file = _secret_path(value, environ) if from_env else base / Path(value).expanduser()
        del node[key]
        node[target] = _read(file, *where)
        origins[(*path, target)] = f"secret file {file} ({told})"


def _secret_path(value: str, environ: Mapping[str, str]) -> Path:
    """A secret file named in the environment: a relative path is in ``$CREDENTIALS_DIRECTORY`` (systemd), else here."""
    file = Path(value).expanduser()
    credentials = environ.get("CREDENTIALS_DIRECTORY")
    return file if file.is_absolute() else (Path(credentials) if credentials else Path.cwd()) / file


def _read(file: Path, source: str, location: str) -> str:
    """The secret in ``file``, one trailing newline (LF or CR LF) dropped; else the one-line error."""
    try:
        content = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(source, location, f"cannot read the secret file: {getattr(exc, 'strerror', None) or exc}",
                         str(file)) from None
    return content.removesuffix("\n").removesuffix("\r")


def read_secret_file(value: str, variable: str) -> str:
    """The secret in the file an environment variable (``variable``) names (``rpc``'s transport URL)."""
    return _read(_secret_path(value, os.environ), "environment", variable)


def located(error: InputError, layered: Layered) -> InputError:
    """``error`` (from validating the layered data) said where its value came from, its secret masked.

    A value set by ``RATEBEAM_X`` is the variable's mistake (``environment: RATEBEAM_X: ...``); one
    read from a secret file names the file; a secret's value is never shown.
    """
    by_location = {dotted(path): origin for path, origin in layered.origins.items()}
    location = error.location or ""
    origin = next((by_location[k] for k in sorted(by_location, key=len, reverse=True)
                   if location == k or location.startswith((k + ".", k + "["))), None)
    key = re.split(r"[.\[\]]", location.rstrip("]"))[-1] if location else ""
    value: Any = MASK if key in SECRET_KEYS else masked(key, error.value)
    if origin is not None and origin.startswith("env "):
        variable = origin.split()[1]
        return _error("environment", variable, error.message, error.has_value, value)
    if origin is not None and origin.startswith("secret file "):
        return _error(origin.split()[2], location, error.message, error.has_value, value)
    return _error(error.source, location, error.message, error.has_value, value)


def _error(source: str, location: str, message: str, has_value: bool, value: Any) -> InputError:
    return InputError(source, location, message, value) if has_value else InputError(source, location, message)
