"""The error every start-up check raises: the CLI prints its one line and exits 2 before any work starts."""

from __future__ import annotations


class ConfigError(ValueError):
    """A config problem the user can fix on the command line."""
