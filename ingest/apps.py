from __future__ import annotations

from django.apps import AppConfig


class IngestConfig(AppConfig):
    name = "ingest"
    verbose_name = "Alerts in (gate)"

    def ready(self) -> None:
        from api.metrics import add_collector
        from diagnosis.maintenance import register
        from ingest import signals  # noqa: F401  (reload the gate snapshot on admin saves)
        from ingest.actions import prune_observations
        from ingest.metrics import GateCollector

        add_collector(GateCollector)
        register("prune-observations", prune_observations)
