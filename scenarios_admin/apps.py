from __future__ import annotations

from django.apps import AppConfig


class ScenariosAdminConfig(AppConfig):
    name = "scenarios_admin"
    verbose_name = "Scenarios, airport and providers"

    def ready(self) -> None:
        # Connects the signals that keep every process's cached airport graph current.
        from scenarios_admin import airport  # noqa: F401
