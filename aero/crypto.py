"""Secrets at rest (provider API keys): MultiFernet over the keys in AERO_ENCRYPTION_KEYS.

The first key encrypts, every key decrypts, so a key is rotated by putting a new one
first, running `manage.py rotate_keys` (re-encrypts every stored secret with it), then
dropping the old one. Production mode (DATABASE_URL) must be given the keys, so that every
host (web, workers) decrypts the same secrets; embedded mode generates one into var/.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from functools import cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings


def fernet_for(material: str) -> Fernet:
    """A Fernet key as given (Fernet.generate_key()), or any other string stretched into
    one (older installs configured AERO_ENCRYPTION_KEY as a passphrase)."""
    try:
        if len(base64.urlsafe_b64decode(material.encode())) == 32:
            return Fernet(material.encode())
    except (binascii.Error, ValueError):
        pass
    digest = hashlib.sha256(("aero-secrets:" + material).encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


@cache
def _multi(keys: tuple[str, ...]) -> MultiFernet:
    return MultiFernet([fernet_for(key) for key in keys])


def _fernet() -> MultiFernet:
    keys = tuple(settings.AERO_ENCRYPTION_KEYS)
    if not keys:
        raise ValueError("no encryption key is configured (AERO_ENCRYPTION_KEYS)")
    return _multi(keys)


def encrypt(plaintext: str) -> str:
    return _fernet().encrypt(plaintext.encode()).decode()


def decrypt(token: str) -> str:
    try:
        return _fernet().decrypt(token.encode()).decode()
    except InvalidToken as exc:
        raise ValueError("secret cannot be decrypted with the configured key") from exc


def rotate(token: str) -> str:
    """The same secret encrypted with the first key (MultiFernet.rotate)."""
    try:
        return _fernet().rotate(token.encode()).decode()
    except InvalidToken as exc:
        raise ValueError("secret cannot be decrypted with the configured keys") from exc
