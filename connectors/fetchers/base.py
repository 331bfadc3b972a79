"""What a scope fetcher is: the bounded source of the scopes to rate (spec §3.2-3.5)."""

from __future__ import annotations

import abc


class Fetcher(abc.ABC):
    """Lists scope ids.  Built on workers from its (picklable) configuration."""

    name: str

    @abc.abstractmethod
    def scopes(self) -> list[str]:
        """The scope ids to consider this cycle, de-duplicated, in a stable order."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release clients."""
