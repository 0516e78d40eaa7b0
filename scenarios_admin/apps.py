from __future__ import annotations

from django.apps import AppConfig


class ScenariosAdminConfig(AppConfig):
    name = "scenarios_admin"
    verbose_name = "Scenarios and providers"

    def ready(self) -> None:
        from aero import audit_trail
        from scenarios_admin.models import ProviderConfig

        audit_trail.connect_provider(ProviderConfig)
