"""The alert gate's metrics, added to /metrics (api.metrics) by this app."""

from __future__ import annotations

from collections.abc import Iterator

from django.db.models import Count
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from ingest.models import Observation


class GateCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "aero_gate_decisions",
            "Observations through the alert gate, by deciding stage and outcome.",
            labels=["stage", "decision"],
        )
        rows = Observation.objects.values("stage", "decision").annotate(n=Count("pk")).order_by()
        for row in rows:
            family.add_metric([row["stage"], row["decision"]], row["n"])
        yield family
