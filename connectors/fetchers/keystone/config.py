"""``ratebeam.yaml`` options of the Keystone fetcher (`cloudkitty/fetcher/keystone.py:55-105`) and of every Keystone session.

```yaml
fetcher:
  backend: keystone
  url: http://keystone:5000/v3          # Keystone's v3 endpoint (CloudKitty's auth_url)
  username: cloudkitty                  # password authentication, scoped to a project ...
  password: secret
  user_domain_name: Default             # or user_domain_id
  project_name: service                 # or project_id
  project_domain_name: Default          # or project_domain_id (with project_name)
  # ... or an application credential (it carries its own scope):
  # application_credential_id: 0123abcd  (or application_credential_name with username and user domain)
  # application_credential_secret: s3cr3t
  cafile: ca.pem                        # or insecure: true; certfile/keyfile: a TLS client certificate
  timeout: 60
  retries: 3
  backoff: 0.5
  ignore_rating_role: false             # CloudKitty's [fetcher_keystone] options
  ignore_disabled_tenants: false
```
``KeystoneOptions`` is also the ``keystone`` section of the Aetos collector.  Nothing here imports
keystoneauth1: loading a configuration must not need the optional ``openstack`` extra.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from ratebeam.connectors.config_model import (
    NOTHING,
    Boolean,
    Invalid,
    NonEmptyStr,
    Text,
    dataclass_from,
    integer,
    seconds,
)
from ratebeam.connectors.fetchers.keystone.credentials import KeystoneCredentials
from ratebeam.connectors.http import MAX_RETRIES
from ratebeam.connectors.http_options import HttpOptions, existing_file

_PROJECT = ("project_name", "project_id", "project_domain_name", "project_domain_id")


class KeystoneOptions(HttpOptions):
    """How to authenticate to Keystone: password (project-scoped) or application credential; TLS."""

    url_example: ClassVar[str] = "Keystone's v3 endpoint, e.g. http://keystone:5000/v3"

    username: NonEmptyStr | None = Field(None, description="The user of password authentication (CloudKitty's rating user), or the owner of a named application credential.")
    password: Text | None = Field(None, description="The user's password (password authentication).")
    user_domain_name: NonEmptyStr | None = Field(None, description="The user's domain, by name (or `user_domain_id`).")
    user_domain_id: NonEmptyStr | None = Field(None, description="The user's domain, by id (or `user_domain_name`).")
    project_name: NonEmptyStr | None = Field(None, description="The project the token is scoped to, by name (with `project_domain_name` or `project_domain_id`).")
    project_id: NonEmptyStr | None = Field(None, description="The project the token is scoped to, by id (or `project_name`).")
    project_domain_name: NonEmptyStr | None = Field(None, description="The domain of `project_name`, by name.")
    project_domain_id: NonEmptyStr | None = Field(None, description="The domain of `project_name`, by id.")
    application_credential_id: NonEmptyStr | None = Field(None, description="An application credential's id (it carries its own scope: no project then).")
    application_credential_name: NonEmptyStr | None = Field(None, description="An application credential's name (with `username` and the user's domain).")
    application_credential_secret: Text | None = Field(None, description="The application credential's secret.")
    certfile: NonEmptyStr | None = Field(None, description="A TLS client certificate to present to Keystone; relative to the file; it must exist.")
    keyfile: NonEmptyStr | None = Field(None, description="The private key of `certfile` (needs `certfile`).")
    retries: integer(0, MAX_RETRIES) = Field(3, description="Attempts after the first for a failed request (connection errors, timeouts, 429, 5xx), with backoff.")  # type: ignore[valid-type]  # built at run time (config_model)
    backoff: seconds(0, 60, open_low=False) = Field(0.5, description="Seconds before the first retry (doubled each time).")  # type: ignore[valid-type]  # built at run time (config_model)

    @field_validator("url")
    @classmethod
    def _v3(cls, url: str) -> str:
        if not url.rstrip("/").endswith("/v3"):
            raise Invalid(f"must end with /v3 ({cls.url_example})")
        return url.rstrip("/")

    @field_validator("certfile", "keyfile")
    @classmethod
    def _existing(cls, path: str | None, info: ValidationInfo) -> str | None:
        return existing_file(path, info)

    @model_validator(mode="after")
    def _auth(self) -> KeystoneOptions:
        user_domain = self.user_domain_name is not None or self.user_domain_id is not None
        if self.user_domain_name is not None and self.user_domain_id is not None:
            raise Invalid("give user_domain_name or user_domain_id, not both", NOTHING, ("user_domain_id",))
        if self.keyfile is not None and self.certfile is None:
            raise Invalid("keyfile needs certfile", NOTHING, ("keyfile",))
        if self.application_credential_secret is not None:
            return self._application_credential(user_domain)
        if self.application_credential_id is not None or self.application_credential_name is not None:
            raise Invalid("an application credential needs application_credential_secret", NOTHING)
        if self.username is None or self.password is None:
            raise Invalid("give username and password, or an application credential "
                          "(application_credential_id and application_credential_secret)", NOTHING)
        if not user_domain:
            raise Invalid("username needs user_domain_name or user_domain_id", NOTHING, ("username",))
        if (self.project_name is None) == (self.project_id is None):
            raise Invalid("give project_name or project_id (the project the token is scoped to)", NOTHING)
        if self.project_name is not None and self.project_domain_name is None and self.project_domain_id is None:
            raise Invalid("project_name needs project_domain_name or project_domain_id", NOTHING, ("project_name",))
        return self

    def _application_credential(self, user_domain: bool) -> KeystoneOptions:
        if self.password is not None:
            raise Invalid("use either password or an application credential, not both", NOTHING, ("password",))
        for key in _PROJECT:
            if getattr(self, key) is not None:
                raise Invalid("an application credential carries its own scope: no project here", NOTHING, (key,))
        if self.application_credential_id is None:
            if self.application_credential_name is None:
                raise Invalid("give application_credential_id, or application_credential_name with username",
                              NOTHING)
            if self.username is None or not user_domain:
                raise Invalid("application_credential_name needs username and user_domain_name (or _id)", NOTHING)
        return self

    @property
    def credentials(self) -> KeystoneCredentials:
        """The runtime credentials the Keystone session is built from."""
        return dataclass_from(KeystoneCredentials, self)


class KeystoneFetcherConfig(KeystoneOptions):
    """The ``keystone`` fetcher: the projects where the rating user has the ``rating`` role."""

    backend: Literal["keystone"] = Field(description="The Keystone fetcher: the projects where the rating user has the `rating` role (CloudKitty's `[fetcher_keystone]`).")
    ignore_rating_role: Boolean = Field(False, description="True: every project, whatever its roles (CloudKitty's `ignore_rating_role`).")
    ignore_disabled_tenants: Boolean = Field(False, description="True: leave disabled projects out (CloudKitty's `ignore_disabled_tenants`).")

