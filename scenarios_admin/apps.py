from __future__ import annotations

from django.apps import AppConfig


class ScenariosAdminConfig(AppConfig):
    name = "scenarios_admin"
    verbose_name = "Scenarios, airport and providers"
