from __future__ import annotations

from django.apps import AppConfig


class IngestConfig(AppConfig):
    name = "ingest"
    verbose_name = "Alerts in (gate)"

    def ready(self) -> None:
        from api.metrics import add_collector
        from ingest import signals  # noqa: F401  (reload the gate snapshot on admin saves)
        from ingest.metrics import GateCollector

        add_collector(GateCollector)
