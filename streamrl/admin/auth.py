"""The admin token and the files a run directory holds for its admin endpoint.

The token comes from ``admin.token`` in the config, else ``$STREAMRL_ADMIN_TOKEN``, else a
fresh ``secrets.token_urlsafe(32)`` per run. Whichever it is, it is written to
``RUN_DIR/admin.token`` with mode 0600 so that ``streamrl admin --run RUN_DIR`` (same user)
can read it and nobody else on the machine can. Tokens are compared in constant time.

Stdlib (plus the config leaf and ``streamrl.files``) only: the command-line client imports
this module.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
from pathlib import Path

from streamrl.config import ConfigError
from streamrl.files import atomic_write_text

log = logging.getLogger("streamrl.admin")

TOKEN_ENV = "STREAMRL_ADMIN_TOKEN"
TOKEN_FILE = "admin.token"
URL_FILE = "admin.url"
AUDIT_FILE = "audit.jsonl"


def resolve_token(configured: str | None = None) -> str:
    """``admin.token`` > ``$STREAMRL_ADMIN_TOKEN`` > a random token; checked for header safety."""
    token = configured or os.environ.get(TOKEN_ENV) or secrets.token_urlsafe(32)
    source = "admin.token" if configured else TOKEN_ENV
    # The token travels in an HTTP header and in a one-line file: visible ASCII, no spaces.
    if not all(33 <= ord(ch) <= 126 for ch in token):
        raise ConfigError(f"{source} must be printable ASCII without spaces")
    if len(token) < 16:
        log.warning(
            "%s is %d characters long; a short admin token is easy to guess", source, len(token)
        )
    return token


def write_token(run_dir: Path, token: str) -> Path:
    path = Path(run_dir) / TOKEN_FILE
    # The mode is set before any byte is written: the secret is never readable by others.
    atomic_write_text(path, token + "\n", mode=0o600)
    return path


def read_token(run_dir: Path) -> str:
    return (Path(run_dir) / TOKEN_FILE).read_text().strip()


def token_matches(given: str | None, expected: str) -> bool:
    """Constant-time comparison (``hmac.compare_digest``) of a presented token."""
    if given is None:
        return False
    return hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))
