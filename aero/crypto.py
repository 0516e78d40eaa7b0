"""Secrets at rest (provider API keys): Fernet with a key from the environment."""

from __future__ import annotations

import base64
import hashlib

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings


def _fernet() -> Fernet:
    # AERO_ENCRYPTION_KEY may be any string; it is stretched to a Fernet key. Without it
    # the SECRET_KEY is used, so embedded mode works with no configuration.
    material = settings.AERO_ENCRYPTION_KEY or settings.SECRET_KEY
    digest = hashlib.sha256(("aero-secrets:" + material).encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


def encrypt(plaintext: str) -> str:
    return _fernet().encrypt(plaintext.encode()).decode()


def decrypt(token: str) -> str:
    try:
        return _fernet().decrypt(token.encode()).decode()
    except InvalidToken as exc:
        raise ValueError("secret cannot be decrypted with the configured key") from exc
