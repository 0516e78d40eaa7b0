"""Alerts in: each alert passes the gate, its verdict is recorded, and a DELIVER opens a
session or appends to the open session of its group (never a second one)."""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from aero.models import audit
from aero.text import MAX_MESSAGE
from diagnosis.actions import ActionError, do_create_session
from diagnosis.eventlog.names import TIMELINE_APPENDED
from diagnosis.events import append_event
from diagnosis.models import Session
from ingest.config import GateSnapshot, provider
from ingest.gate import DELIVER, DROP, FIRING, RESOLVED, SINK, Alert, Verdict, decide, describe
from ingest.models import AlertGroup, Decision, Observation, Stage
from ingest.schemas import MAX_LABEL_VALUE, cut
from scenarios_admin.models import Scenario

logger = logging.getLogger("ingest")
PRODUCER = "ingest"
REFUSE = Decision.REFUSE
MAX_KEPT_KEYS = 200  # labels or annotations kept of a refused alert


def repeat_of(
    fingerprint: str, group_key: str, status: str, starts_at: datetime | None, window: int
) -> Observation | None:
    """The kept observation this alert repeats, or None. Only the latest kept observation
    of the alert (fingerprint and group) counts: a firing after its resolution, a new
    startsAt (Alertmanager keeps it for one episode) or a session that has ended since
    each begin a new episode, which is never a repeat."""
    last = (
        Observation.objects.filter(fingerprint=fingerprint, group_key=group_key)
        .exclude(decision__in=(DROP, REFUSE))
        .select_related("session")
        .order_by("-received_at", "-id")
        .first()
    )
    if last is None or last.status != status:
        return None
    if last.received_at < timezone.now() - timedelta(seconds=window):
        return None
    if starts_at is not None and last.starts_at is not None and starts_at != last.starts_at:
        return None
    session = last.session
    if session is not None and (session.is_ended or session.deleted_at is not None):
        return None
    return last


PRUNE_BATCH = 1000


def prune_observations() -> int:
    """Periodic (the workers' maintenance loop): delete observations older than
    AERO_OBSERVATION_RETENTION_DAYS, a batch at a time. Returns how many went."""
    cutoff = timezone.now() - timedelta(days=settings.AERO_OBSERVATION_RETENTION_DAYS)
    old = Observation.objects.filter(received_at__lt=cutoff).order_by("received_at")
    pks = list(old.values_list("pk", flat=True)[:PRUNE_BATCH])
    if not pks:
        return 0
    deleted, _ = Observation.objects.filter(pk__in=pks).delete()
    return deleted


def ingest_user() -> Any:
    """The user sessions opened by shared-secret alerts belong to (cannot log in)."""
    user_model = get_user_model()
    user, created = user_model.objects.get_or_create(username=settings.AERO_INGEST_USERNAME)
    if created:
        user.set_unusable_password()
        user.save(update_fields=["password"])
    return user


def _record(
    alert: Alert, verdict: Verdict, config: GateSnapshot, user: Any, session: Session | None = None
) -> Observation:
    # A dropped alert is counted and its content discarded, unless it is a repeat that
    # carries something its episode's kept observation does not (a new description).
    kept = verdict.decision != DROP or (
        verdict.repeats is not None
        and (
            verdict.repeats.labels != dict(alert.labels)
            or verdict.repeats.annotations != dict(alert.annotations)
        )
    )
    return Observation.objects.create(
        source=alert.source[:64],
        actor=alert.actor[:150],
        name=alert.name[:200],
        status=alert.status,
        fingerprint=verdict.fingerprint,
        group_key=verdict.group_key,
        labels=dict(alert.labels) if kept else {},
        annotations=dict(alert.annotations) if kept else {},
        starts_at=alert.starts_at,
        decision=verdict.decision,
        stage=verdict.stage,
        reason=verdict.reason[:300],
        score=max(-32768, min(32767, verdict.score)),
        rule_id=verdict.rule.id if verdict.rule else None,
        session=session,
        config_revision=config.version,
        received_by=user if getattr(user, "pk", None) else None,
    )


def do_ingest(alert: Alert, user: Any) -> Observation:
    """Decide and record one alert. A DELIVER locks the alert group's row, so two
    deliveries of one group (a repeat, a concurrent notification) find the same open
    session: the first opens it, the others append to it."""
    config = provider.current()
    verdict = decide(alert, config, repeat_of)
    if verdict.decision != DELIVER:
        return _record(alert, verdict, config, user)
    with transaction.atomic():
        group, _ = AlertGroup.objects.get_or_create(group_key=verdict.group_key)
        group = (
            AlertGroup.objects.select_for_update(of=("self",))
            .select_related("session")
            .get(pk=group.pk)
        )
        session = group.session
        if session is not None and (session.is_ended or session.deleted_at is not None):
            session = None
        if session is not None:
            verdict = _with_reason(verdict, "appended to the group's open session")
            observation = _record(alert, verdict, config, user, session)
            _append(session, alert, observation)
        elif alert.status == RESOLVED:
            verdict = Verdict(
                SINK,
                "deliver",
                "resolved, and the group has no open session",
                verdict.score,
                verdict.rule,
                verdict.fingerprint,
                verdict.group_key,
            )
            observation = _record(alert, verdict, config, user)
        else:
            try:
                session = _open_session(alert, verdict, user)
            except ActionError as exc:
                # Kept for the record; the scenario cannot run (e.g. unpublished).
                verdict = Verdict(
                    SINK,
                    "deliver",
                    f"could not open a session: {exc}"[:300],
                    verdict.score,
                    verdict.rule,
                    verdict.fingerprint,
                    verdict.group_key,
                )
                return _record(alert, verdict, config, user)
            group.session = session
            group.save(update_fields=["session", "updated_at"])
            verdict = _with_reason(verdict, "opened a session")
            observation = _record(alert, verdict, config, user, session)
            _append(session, alert, observation)
        if observation.session_id:
            audit(
                "ingest.delivered",
                obj=observation,
                actor=user,
                session_id=observation.session_id,
                detail={**observation.as_record(), "group": verdict.group_key},
            )
    return observation


def _kept_text(value: Any, limit: int = MAX_LABEL_VALUE) -> str:
    """A value of a refused alert as text that can be stored: NUL replaced, cut."""
    if not isinstance(value, str):
        try:
            value = json.dumps(value, ensure_ascii=False, default=str)
        except (RecursionError, ValueError):
            value = "(nested too deep to keep)"
    return cut(value.replace("\x00", "\ufffd"), limit)


def _kept_mapping(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        return {"(as sent)": _kept_text(value)}
    return {_kept_text(k, 200): _kept_text(v) for k, v in list(value.items())[:MAX_KEPT_KEYS]}


def do_refuse(raw: Any, reason: str, source: str, group_key: str, user: Any) -> Observation:
    """Record an alert that failed validation, with the reason and what it carried (as
    far as it can be stored): refused, never silently lost."""
    item = raw if isinstance(raw, dict) else {}
    labels = _kept_mapping(item.get("labels"))
    annotations = _kept_mapping(item.get("annotations"))
    if not isinstance(raw, dict):
        annotations = {"(as sent)": _kept_text(raw)}
    status = item.get("status")
    fingerprint = item.get("fingerprint")
    if not isinstance(fingerprint, str) or not fingerprint:
        fingerprint = Alert(source=source, status="", labels=labels).label_fingerprint()
    logger.warning("alert refused: %s", reason)
    return Observation.objects.create(
        source=_kept_text(source, 64),
        name=labels.get("alertname", "")[:200],
        status=status if status in (FIRING, RESOLVED) else "",
        fingerprint=_kept_text(fingerprint, 64),
        group_key=group_key[:255],
        labels=labels,
        annotations=annotations,
        decision=REFUSE,
        stage=Stage.VALIDATE,
        reason=reason[:300],
        received_by=user if getattr(user, "pk", None) else None,
    )


def _with_reason(verdict: Verdict, outcome: str) -> Verdict:
    return Verdict(
        verdict.decision,
        verdict.stage,
        f"{verdict.reason}; {outcome}",
        verdict.score,
        verdict.rule,
        verdict.fingerprint,
        verdict.group_key,
    )


def _open_session(alert: Alert, verdict: Verdict, user: Any) -> Session:
    assert verdict.rule is not None and verdict.rule.scenario_slug is not None
    scenario = Scenario.objects.filter(slug=verdict.rule.scenario_slug).first()
    if scenario is None:
        raise ActionError(f"scenario {verdict.rule.scenario_slug} no longer exists")
    return do_create_session(user, scenario, describe(alert)[:MAX_MESSAGE], producer=PRODUCER)


def _append(session: Session, alert: Alert, observation: Observation) -> None:
    """The alert in the session's log (the session's own record of what came in)."""
    append_event(
        session.pk,
        TIMELINE_APPENDED,
        {
            "kind": "alert",
            "source": alert.source,
            "name": alert.name,
            "status": alert.status,
            "fingerprint": observation.fingerprint,
            "summary": alert.annotations.get("summary", ""),
            "observation": observation.pk,
        },
        producer=PRODUCER,
    )
