from __future__ import annotations

from django.apps import AppConfig


class AirportPackConfig(AppConfig):
    """The airport apron emergency domain (scenario kind "apron")."""

    name = "packs.airport"
    label = "airport"
    verbose_name = "Airport apron"

    def ready(self) -> None:
        from aero.packs import DomainPack, register
        from packs.airport.definition import ApronDefinition

        register(
            DomainPack(
                kind="apron",
                app_label=self.label,
                label={"zh": "机坪应急", "en": "Apron emergency"},
                definition_model=ApronDefinition,
            )
        )
