"""Per-job bootstrap tokens: make one, read one from a file or an environment variable.

Side effects: :func:`write_token` creates a file with mode 0600; :func:`read_token` reads a
file or the environment.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

MIN_LEN = 16


def new_token() -> str:
    return secrets.token_urlsafe(32)


def write_token(path: str | os.PathLike[str], token: str) -> Path:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token + "\n")
    os.chmod(target, 0o600)
    return target


def read_token(*, path: str = "", env: str = "") -> str:
    """The job's bootstrap token from a file or an environment variable (ValueError if none)."""
    if path:
        try:
            token = Path(path).read_text().strip()
        except OSError as exc:
            raise ValueError(f"cannot read the bootstrap token file {path}: {exc.strerror}") \
                from None
    elif env:
        token = os.environ.get(env, "").strip()
        if not token:
            raise ValueError(f"environment variable {env} holds no bootstrap token")
    else:
        raise ValueError("no bootstrap token: pass --token-file or --token-env")
    if len(token) < MIN_LEN:
        raise ValueError(f"the bootstrap token is shorter than {MIN_LEN} characters")
    return token
