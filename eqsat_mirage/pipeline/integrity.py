"""Integrity tags for the results cache: an HMAC under a secret only this user can read.

The secret (32 random bytes) lives in ``key_path()``, outside the cache folder,
created with mode 0600 in a 0700 folder; a key file or folder owned by someone
else, or open to other users, is refused with a ``CacheError``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path

from ..ir.errors import MirageError


class CacheError(MirageError):
    """A cache path that is not this cache's own database, or an unusable key file."""


def key_path() -> Path:
    """This user's tag secret: ``$EQSAT_MIRAGE_CONFIG_DIR``, else ``$XDG_CONFIG_HOME/eqsat-mirage``,
    else ``~/.config/eqsat-mirage``, then ``cache.key``."""
    env = os.environ.get("EQSAT_MIRAGE_CONFIG_DIR")
    if env:
        return Path(env).expanduser() / "cache.key"
    xdg = os.environ.get("XDG_CONFIG_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".config"
    return base / "eqsat-mirage" / "cache.key"


def _private(path: Path, what: str) -> os.stat_result:
    st = path.stat()
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise CacheError(f"{what} {path} belongs to uid {st.st_uid}, not to this user; refusing it")
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise CacheError(f"{what} {path} is open to other users (mode "
                         f"{stat.S_IMODE(st.st_mode):o}); refusing it")
    return st


def secret() -> bytes:
    """This user's tag secret, created (32 random bytes, mode 0600) on first use. It is
    written to a private temporary file and linked into place, so a process or thread
    reading it never sees a partly written key."""
    path = key_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    _private(path.parent, "key folder")
    if not path.exists():
        data = secrets.token_bytes(32)
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.link(tmp, path)  # atomic, and refused if another writer was first
            return data
        except FileExistsError:
            pass  # another process or thread made it: read theirs below
        finally:
            tmp.unlink(missing_ok=True)
    _private(path, "key file")
    data = path.read_bytes()
    if len(data) != 32:
        raise CacheError(f"key file {path} is not 32 bytes; remove it to make a new one")
    return data


def tag(key: str, text: str) -> str:
    """The integrity tag of the entry ``text`` stored under ``key``."""
    return hmac.new(secret(), key.encode() + b"\0" + text.encode(), hashlib.sha256).hexdigest()
