"""Re-encrypt every stored secret with the first of AERO_ENCRYPTION_KEYS (docs/security.md)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from aero import crypto
from aero.models import audit
from scenarios_admin.models import ProviderConfig


class Command(BaseCommand):
    help = (
        "Re-encrypt every provider API key with the first key of AERO_ENCRYPTION_KEYS. Put "
        "the new key first, run this, then remove the old key from the list."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        # All or nothing: a secret no configured key decrypts stops the run with its name,
        # and nothing is half-rotated.
        with transaction.atomic():
            configs = list(
                ProviderConfig.objects.select_for_update()
                .exclude(api_key_encrypted="")
                .order_by("name")
            )
            for config in configs:
                try:
                    config.api_key_encrypted = crypto.rotate(config.api_key_encrypted)
                except ValueError:
                    raise CommandError(
                        f"provider {config.name}: its API key cannot be decrypted with any of "
                        "AERO_ENCRYPTION_KEYS (was a key removed too early?); nothing was changed"
                    ) from None
                config.save(update_fields=["api_key_encrypted"])
            audit(
                "secrets.rotated",
                actor_label="rotate_keys",
                detail={"providers": [c.name for c in configs]},
            )
        self.stdout.write(f"Re-encrypted {len(configs)} provider key(s) with the first key.")
