from __future__ import annotations

from django.apps import AppConfig


class AeroConfig(AppConfig):
    name = "aero"
    verbose_name = "AERO core"
