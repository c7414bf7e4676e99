"""What every config section shares: strict decoding (an unknown key is an error) and the
one error a config that cannot run raises."""

from __future__ import annotations

import msgspec


class ConfigError(ValueError):
    """A config that cannot run; the message is one line meant for the user."""


class _Section(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass
