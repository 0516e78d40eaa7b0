from __future__ import annotations

from django.apps import AppConfig


class AeroConfig(AppConfig):
    name = "aero"
    verbose_name = "AERO core"

    def ready(self) -> None:
        from aero import (
            audit_trail,
            i18n,
            lockouts,  # noqa: F401 (its @receivers connect on import)
            session_store,
            sessions,  # noqa: F401 (its @receiver connects on import)
        )

        audit_trail.connect()
        i18n.connect()
        session_store.connect()
