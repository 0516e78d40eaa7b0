"""The keys the settings read: from the environment, refused when weak in production,
or generated once on disk in embedded mode (docs/security.md)."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from aero.env import env_list, env_str


def _required_in_production(name: str, purpose: str) -> None:
    raise ImproperlyConfigured(
        f"{name} must be set in production mode (DATABASE_URL is set): {purpose}. "
        "See docs/security.md."
    )


def _generated(data_dir: Path, file_name: str, make: Callable[[], str]) -> str:
    # Embedded mode keeps generated secrets on disk so logins and stored keys survive a
    # restart; the file is readable by its owner only.
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / file_name
    if not path.exists():
        path.touch(mode=0o600)
        path.write_text(make())
    return path.read_text().strip()


def refuse_weak(name: str, value: str, minimum: int) -> None:
    """Production refuses a guessable key: Django's own bar for SECRET_KEY (check
    --deploy, W009): enough characters, and not a repetition of a few."""
    if len(value) < minimum or len(set(value)) < 5 or value.startswith("django-insecure-"):
        raise ImproperlyConfigured(
            f"{name} is too weak: use at least {minimum} random characters "
            "(python -c 'import secrets; print(secrets.token_urlsafe(50))'). "
            "See docs/security.md."
        )


def secret_key(production: bool, data_dir: Path) -> str:
    configured = env_str("AERO_SECRET_KEY")
    if configured:
        if production:
            refuse_weak("AERO_SECRET_KEY", configured, 50)
        return configured
    if production:
        _required_in_production("AERO_SECRET_KEY", "it signs sessions and CSRF tokens")
    return _generated(data_dir, "secret_key", lambda: secrets.token_urlsafe(50))


def encryption_keys(secret_key: str, production: bool, data_dir: Path) -> list[str]:
    """AERO_ENCRYPTION_KEYS: comma-separated, the first encrypts, all decrypt (rotation:
    docs/security.md). AERO_ENCRYPTION_KEY, the older single key, still counts."""
    keys = env_list("AERO_ENCRYPTION_KEYS", []) or env_list("AERO_ENCRYPTION_KEY", [])
    if keys:
        if production:
            # A Fernet key (44 characters) passes; a passphrase must be as long.
            for key in keys:
                refuse_weak("AERO_ENCRYPTION_KEYS (each key)", key, 32)
        return keys
    if production:
        _required_in_production(
            "AERO_ENCRYPTION_KEYS",
            "it encrypts provider API keys, and every web and worker host must use the same "
            "keys (generate one with: python -c 'from cryptography.fernet import Fernet; "
            "print(Fernet.generate_key().decode())')",
        )
    from cryptography.fernet import Fernet

    generated = _generated(data_dir, "encryption_keys", lambda: Fernet.generate_key().decode())
    # Secrets stored before the keys file existed were encrypted with a key derived from
    # SECRET_KEY: it still decrypts them (decrypt only) until `rotate_keys` re-encrypts.
    return [*[k.strip() for k in generated.split(",") if k.strip()], secret_key]
