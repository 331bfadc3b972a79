"""The credentials of a Keystone session, as plain data (``session.py`` authenticates with them).

No keystoneauth1 import at module level: loading a configuration must not need the optional
``openstack`` extra.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from ratebeam.connectors.http import HttpSettings, tls_verify


@dataclass(frozen=True)
class KeystoneCredentials:
    """Where Keystone is and who the rating user is (picklable: shipped to Beam workers).

    ``url`` is Keystone's v3 endpoint (``http://keystone:5000/v3``).  Password authentication uses
    ``username``/``password`` (with the user's domain) scoped to a project; an application
    credential (``application_credential_secret`` with its id, or its name and the user) carries
    its own scope.
    """

    url: str
    username: str | None = None
    password: str | None = None
    user_domain_name: str | None = None
    user_domain_id: str | None = None
    project_name: str | None = None
    project_id: str | None = None
    project_domain_name: str | None = None
    project_domain_id: str | None = None
    application_credential_id: str | None = None
    application_credential_name: str | None = None
    application_credential_secret: str | None = None
    cafile: str | None = None
    insecure: bool = False
    certfile: str | None = None
    keyfile: str | None = None
    timeout: float = 60.0
    retries: int = 3
    backoff: float = 0.5

    def __repr__(self) -> str:  # never print secrets in logs or failure reasons
        who = self.username or self.application_credential_id or self.application_credential_name
        return f"KeystoneCredentials(url={self.url!r}, user={who!r})"

    @property
    def verify(self) -> bool | str:
        """``requests``' ``verify``: False (insecure), the CA bundle's path, or True."""
        return tls_verify(self.insecure, self.cafile)

    @property
    def cert(self) -> str | tuple[str, str] | None:
        """The TLS client certificate, as ``requests`` takes it."""
        if self.certfile and self.keyfile:
            return (self.certfile, self.keyfile)
        return self.certfile

    def http_settings(self, url: str, backend: str) -> HttpSettings:
        """``connectors.http`` settings for an API at ``url`` reached with these TLS options."""
        return HttpSettings(url, backend, self.verify, self.timeout, self.retries, self.backoff, self.cert)

    def plugin(self) -> Any:
        """Keystoneauth's v3 auth plugin for these credentials (its arguments are our field names)."""
        from keystoneauth1.identity import v3  # the optional ``openstack`` extra: imported when used

        given = {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}
        if self.application_credential_secret is not None:
            keys: tuple[str, ...] = ("username", "user_domain_name", "user_domain_id", "application_credential_id",
                    "application_credential_name", "application_credential_secret")
            return v3.ApplicationCredential(auth_url=self.url, **{k: given[k] for k in keys if k in given})
        keys = ("username", "password", "user_domain_name", "user_domain_id", "project_name", "project_id",
                "project_domain_name", "project_domain_id")
        return v3.Password(auth_url=self.url, **{k: given[k] for k in keys if k in given})
