"""/metrics in the Prometheus text format.

Two sources, summed into one registry per scrape:
- the multi-process files every process writes (aero/metrics.py: pushes, WebSocket
  connects and sends, commit-to-send latency, job durations, API calls);
- collectors computed at scrape time from the database for what the database already
  knows exactly (sessions by status, LLM calls/tokens/cost, approval waits, gate
  decisions, job queue depth). Each is one aggregate query.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, DurationField, ExpressionWrapper, F, Q, Sum
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, multiprocess
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from approvals.models import OPEN_STATUSES, Approval
from diagnosis.models import LLMCall, Session, SessionStatus
from scenarios_admin import breaker
from scenarios_admin.models import ProviderConfig, ProviderKind

logger = logging.getLogger("api.metrics")

# Approval waits: seconds to hours (deadlines are minutes; a human may take a while).
WAIT_BUCKETS = (5, 15, 30, 60, 120, 300, 600, 900, 1800, 3600)


class DatabaseCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        yield self.sessions()
        yield from self.llm()
        yield self.breakers()
        yield from self.approvals()
        yield self.queue()

    @staticmethod
    def breakers() -> Metric:
        """Each enabled real provider's circuit breaker now, as every process sees it."""
        family = GaugeMetricFamily(
            "aero_llm_provider_breaker",
            "Model providers' circuit breakers: 1 for the state each is in (closed, open, "
            "half_open), 0 for the others.",
            labels=["provider", "state"],
        )
        configs = ProviderConfig.objects.filter(enabled=True, kind=ProviderKind.OPENAI)
        for config in configs.select_related("health").order_by("name"):
            state = breaker.state_of(getattr(config, "health", None))
            for each in (breaker.CLOSED, breaker.OPEN, breaker.HALF_OPEN):
                family.add_metric([config.name, each], 1 if each == state else 0)
        return family

    @staticmethod
    def sessions() -> Metric:
        family = GaugeMetricFamily(
            "aero_sessions", "Incident sessions by status (deleted excluded).", labels=["status"]
        )
        counts = dict(
            Session.objects.visible().values_list("status").annotate(n=Count("pk")).order_by()
        )
        for status in SessionStatus.values:
            family.add_metric([status], counts.get(status, 0))
        return family

    @staticmethod
    def llm() -> Iterator[Metric]:
        calls = CounterMetricFamily(
            "aero_llm_calls", "LLM calls by provider and status.", labels=["provider", "status"]
        )
        tokens = CounterMetricFamily(
            "aero_llm_tokens",
            "LLM tokens by provider and direction.",
            labels=["provider", "direction"],
        )
        estimated = CounterMetricFamily(
            "aero_llm_tokens_estimated",
            "LLM tokens AERO estimated because the provider reported no usage (a part of "
            "aero_llm_tokens), by provider and direction.",
            labels=["provider", "direction"],
        )
        cost = CounterMetricFamily(
            "aero_llm_cost",
            "LLM cost by provider (the configured price unit).",
            labels=["provider"],
        )
        rows = (
            LLMCall.objects.values("provider", "status")
            .annotate(
                n=Count("pk"),
                tin=Sum("tokens_in"),
                tout=Sum("tokens_out"),
                c=Sum("cost"),
                ein=Sum("tokens_in", filter=Q(tokens_estimated=True)),
                eout=Sum("tokens_out", filter=Q(tokens_estimated=True)),
            )
            .order_by()
        )
        by_provider: dict[str, list[float]] = {}
        for row in rows:
            calls.add_metric([row["provider"], row["status"]], row["n"])
            totals = by_provider.setdefault(row["provider"], [0.0, 0.0, 0.0, 0.0, 0.0])
            totals[0] += row["tin"] or 0
            totals[1] += row["tout"] or 0
            totals[2] += float(row["c"] or 0)
            totals[3] += row["ein"] or 0
            totals[4] += row["eout"] or 0
        for provider, (tin, tout, total_cost, ein, eout) in sorted(by_provider.items()):
            tokens.add_metric([provider, "in"], tin)
            tokens.add_metric([provider, "out"], tout)
            estimated.add_metric([provider, "in"], ein)
            estimated.add_metric([provider, "out"], eout)
            cost.add_metric([provider], total_cost)
        yield calls
        yield tokens
        yield estimated
        yield cost

    @staticmethod
    def approvals() -> Iterator[Metric]:
        wait = ExpressionWrapper(F("decided_at") - F("created_at"), output_field=DurationField())
        buckets = {
            f"le_{i}": Count("pk", filter=Q(wait__lte=timedelta(seconds=bound)))
            for i, bound in enumerate(WAIT_BUCKETS)
        }
        rows = (
            Approval.objects.filter(decided_at__isnull=False)
            .annotate(wait=wait)
            .values("risk_class")
            .annotate(n=Count("pk"), total=Sum("wait"), **buckets)
            .order_by("risk_class")
        )
        histogram = HistogramMetricFamily(
            "aero_approval_wait_seconds",
            "From an approval's request to its final decision (or timeout), by risk class.",
            labels=["risk_class"],
        )
        for values in rows:
            row: dict[str, Any] = dict(values)
            cumulative = [(str(float(b)), row[f"le_{i}"]) for i, b in enumerate(WAIT_BUCKETS)]
            cumulative.append(("+Inf", row["n"]))
            total = row["total"].total_seconds() if row["total"] else 0.0
            histogram.add_metric([row["risk_class"]], cumulative, max(0.0, total))
        yield histogram
        waiting = GaugeMetricFamily(
            "aero_approvals_open",
            "Approvals waiting for a decision, by risk class.",
            labels=["risk_class"],
        )
        open_counts = dict(
            Approval.objects.filter(status__in=OPEN_STATUSES)
            .values_list("risk_class")
            .annotate(n=Count("pk"))
            .order_by()
        )
        for risk in ("R1", "R2", "R3"):
            waiting.add_metric([risk], open_counts.get(risk, 0))
        yield waiting

    @staticmethod
    def queue() -> Metric:
        family = GaugeMetricFamily(
            "aero_job_queue_depth",
            "Jobs waiting to run, by backend and state.",
            labels=["backend", "state"],
        )
        backend = settings.AERO_JOB_BACKEND
        if backend == "rq":
            try:
                import django_rq

                queue = django_rq.get_queue(settings.AERO_QUEUE)
                first = django_rq.get_queue(settings.AERO_PRIORITY_QUEUE)
                family.add_metric([backend, "queued"], queue.count + first.count)
                family.add_metric([backend, "started"], queue.started_job_registry.count)
                family.add_metric([backend, "failed"], queue.failed_job_registry.count)
            except Exception:
                logger.warning("queue depth unavailable", exc_info=True)
        elif backend == "embedded":
            from diagnosis.jobs import running_embedded_worker

            worker = running_embedded_worker()
            depth = worker.pool._work_queue.qsize() if worker is not None else 0
            family.add_metric([backend, "queued"], depth)
        else:
            family.add_metric([backend, "queued"], 0)  # inline: jobs run in the caller
        return family


def allowed(request: HttpRequest) -> bool:
    """A bearer token (AERO_METRICS_TOKEN) or a client address in AERO_METRICS_ALLOWED_IPS
    (addresses or networks). REMOTE_ADDR only: a proxy's forwarded header is not trusted."""
    expected = settings.AERO_METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    if expected and header.startswith("Bearer "):
        return hmac.compare_digest(header[7:].strip().encode(), expected.encode())
    try:
        client = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    for entry in settings.AERO_METRICS_ALLOWED_IPS:
        try:
            if client in ipaddress.ip_network(entry.strip(), strict=False):
                return True
        except ValueError:
            logger.warning("ignoring bad AERO_METRICS_ALLOWED_IPS entry %r", entry)
    return False


# Collectors of apps this one may not import (the alert gate's), added from their
# AppConfig.ready().
_collectors: list[type[Collector]] = []


def add_collector(collector: type[Collector]) -> None:
    if collector not in _collectors:
        _collectors.append(collector)


def registry() -> CollectorRegistry:
    reg = CollectorRegistry()
    multiprocess.MultiProcessCollector(reg, path=str(settings.PROMETHEUS_MULTIPROC_DIR))
    reg.register(DatabaseCollector())
    for collector in _collectors:
        reg.register(collector())
    return reg


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    if not allowed(request):
        return HttpResponse(
            "metrics: send the metrics token or scrape from an allowed address\n",
            status=403,
            content_type="text/plain; charset=utf-8",
        )
    return HttpResponse(generate_latest(registry()), content_type=CONTENT_TYPE_LATEST)
