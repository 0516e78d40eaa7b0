from __future__ import annotations

from django.apps import AppConfig


class ScenariosAdminConfig(AppConfig):
    name = "scenarios_admin"
    verbose_name = "Scenarios, airport and providers"

    def ready(self) -> None:
        # Connects the signals that keep every process's cached airport graph current.
        from aero import audit_trail
        from scenarios_admin import airport  # noqa: F401
        from scenarios_admin.models import ProviderConfig

        audit_trail.connect_provider(ProviderConfig)
