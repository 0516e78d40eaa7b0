"""The diagnosis pack's pages: the form that opens a diagnosis session (a bundle
uploaded, or one of the shipped demo incidents) and the session page's panel of
evidence and conclusion (server-rendered; the core's live page re-renders it with the
facts panel)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any, Literal
from uuid import UUID

from django import forms
from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import redirect, render
from django.utils import translation
from django.utils.translation import gettext_lazy as _
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from aero.http import HtmxHttpRequest
from aero.packs import HistoryFilter
from aero.roles import RUN_SESSIONS, VIEW_SESSIONS, role_required, user_roles
from aero.text import MAX_MESSAGE, LimitedTextField
from diagnosis.actions import ActionError
from diagnosis.eventlog.masking import SessionMask
from diagnosis.eventlog.state import FoldState
from diagnosis.models import Event, Session, SessionStatus, ToolCall
from diagnosis.templatetags.timeline import scenario_language
from diagnosis.views import get_session_for_user
from packs.diagnosis.bundle import MODES
from packs.diagnosis.charts import metric_chart, service_graph
from packs.diagnosis.knowledge import do_save_as_knowledge, linked_cases
from packs.diagnosis.models import KnowledgeItem, MetricsSource
from packs.diagnosis.modes import MODE_LABELS
from packs.diagnosis.names import SIMILAR
from packs.diagnosis.playbook_data import default_playbook
from packs.diagnosis.sessions import start_from_bundle
from packs.diagnosis.storage import bundle_response, may_download_bundle
from packs.diagnosis.system import demo_shop
from replay.presenters import evidence_calls

EXAMPLES = Path(__file__).resolve().parent / "data" / "examples"
DEMO_TITLES = {
    "ex-deploy-payments": _("Payments fail after a deploy"),
    "ex-pool-inventory": _("Inventory runs out of database connections"),
    "ex-upstream-cache": _("The cache slows everything down"),
}


def _language() -> Literal["zh", "en"]:
    return "zh" if (translation.get_language() or "").startswith("zh") else "en"


def problem_type_choices() -> list[tuple[str, Any]]:
    language = _language()
    return [(key, words[language]) for key, words in default_playbook().problem_types.items()]


def service_choices() -> list[tuple[str, Any]]:
    return [(name, name) for name in sorted(demo_shop().services)]


# History finds a diagnosis by what it concluded (the root cause's problem type and
# service, seed 003 §4.1.5), from the snapshot's root_cause.
HISTORY_FILTERS = (
    HistoryFilter(
        "problem_type", ("root_cause", "problem_type"), _("Problem type"), problem_type_choices
    ),
    HistoryFilter("service", ("root_cause", "service"), _("Service"), service_choices),
)


def demo_incidents() -> list[tuple[str, Any]]:
    return [
        (path.name.removesuffix(".tar.gz"), DEMO_TITLES.get(path.name.removesuffix(".tar.gz")))
        for path in sorted(EXAMPLES.glob("*.tar.gz"))
    ]


class NewDiagnosisForm(forms.Form):
    problem_type = forms.ChoiceField(label=_("Problem type"), required=False)
    description = LimitedTextField(
        what="description",
        label=_("What do you see?"),
        required=False,
        max_length=MAX_MESSAGE,
        strip=True,
        widget=forms.Textarea(
            attrs={"rows": 3, "placeholder": _("Empty: the bundle's own description")}
        ),
    )
    bundle = forms.FileField(
        label=_("Incident bundle (.zip or .tar.gz)"),
        required=False,
        help_text=_("incident.yaml with logs.jsonl, metrics.csv, deploys.yaml, repo/ ..."),
    )
    demo = forms.ChoiceField(label=_("or a demo incident"), required=False)
    preferred_mode = forms.ChoiceField(label=_("Preferred mode"), required=False)
    # The bundle's metrics.csv, or a metrics source an admin configured (Prometheus).
    metrics_source = forms.ChoiceField(label=_("Metrics from"), required=False)
    # The bundle's evidence, or the sources an admin attached to the system (then the
    # bundle may be left out: the incident is the description).
    sources = forms.ChoiceField(
        label=_("Evidence from"),
        required=False,
        choices=[
            ("bundle", _("the bundle")),
            ("system", _("the sources attached to the system (no bundle needed)")),
        ],
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["problem_type"].choices = [  # type: ignore[attr-defined]
            ("", _("Classify from the evidence")),
            *problem_type_choices(),
        ]
        self.fields["demo"].choices = [("", "—"), *demo_incidents()]  # type: ignore[attr-defined]
        self.fields["preferred_mode"].choices = [  # type: ignore[attr-defined]
            ("", _("Default")),
            *((mode, MODE_LABELS[mode]) for mode in MODES),
        ]
        self.fields["metrics_source"].choices = [  # type: ignore[attr-defined]
            ("", _("the bundle's metrics.csv")),
            *(
                (row.name, f"Prometheus {row.name} ({row.base_url})")
                for row in MetricsSource.objects.filter(enabled=True).order_by("name")
            ),
        ]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("sources") == "system" and not data.get("bundle") and not data.get("demo"):
            return data  # the system's sources alone: the description is the incident
        if bool(data.get("bundle")) == bool(data.get("demo")):
            raise forms.ValidationError(
                _("Upload a bundle or choose a demo incident (one of the two).")
            )
        upload = data.get("bundle")
        if upload is not None and upload.size > settings.AERO_BUNDLE_MAX_UPLOAD:
            raise forms.ValidationError(
                _("The bundle is larger than %(max)s bytes.")
                % {"max": settings.AERO_BUNDLE_MAX_UPLOAD}
            )
        return data


@require_http_methods(["GET", "POST"])
@role_required(RUN_SESSIONS)
def new_diagnosis(request: HtmxHttpRequest) -> Any:
    if request.method == "GET":
        return render(request, "diagnosis_pack/new.html", {"form": NewDiagnosisForm()})
    form = NewDiagnosisForm(request.POST, request.FILES)
    if form.is_valid():
        data = form.cleaned_data
        scratch = Path(tempfile.mkdtemp(prefix="aero-upload-"))
        try:
            source: Path | None
            if data["demo"]:
                source = EXAMPLES / f"{data['demo']}.tar.gz"
            elif not data["bundle"]:
                source = None  # the system's sources alone (the form checked the choice)
            else:
                source = scratch / "bundle"
                with source.open("wb") as out:
                    for chunk in data["bundle"].chunks():
                        out.write(chunk)
            session = start_from_bundle(
                request.user,
                source,
                {
                    "producer": "web",
                    "description": data["description"],
                    "problem_type": data["problem_type"],
                    "preferred_mode": data["preferred_mode"],
                    "metrics_source": data["metrics_source"],
                    "sources": data["sources"] or "bundle",
                },
            )
        except ActionError as exc:
            form.add_error(None, str(exc))
        else:
            return redirect("diagnosis:session-detail", session_id=session.pk)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return render(request, "diagnosis_pack/new.html", {"form": form}, status=400)


# --- the session page's panel -------------------------------------------------------------


def blamed_change(cause: dict[str, Any], results: dict[str, Any]) -> dict[str, Any] | None:
    """The deploy, config change or commit the conclusion blames, with its time, as the
    deploys, config_changes and commits evidence calls recorded it (None: it blames none)."""
    wanted = (
        ("deploys", "changes", "id", cause.get("deploy"), _("deploy %(id)s")),
        ("config_changes", "changes", "key", cause.get("config_key"), _("config %(id)s")),
        ("commits", "commits", "commit", cause.get("commit"), _("commit %(id)s")),
    )
    for tool, listed, key, value, words in wanted:
        if not value:
            continue
        for change in (results.get(tool) or {}).get(listed) or []:
            if change.get(key) == value:
                return {"label": words % {"id": str(value)[:10]}, "at": change.get("at")}
    return None


def page_context(session: Session, mask: SessionMask | None) -> dict[str, Any]:
    """What the panel shows: the root cause (from the snapshot's finding) and each
    evidence call with its result, in the order they ran; for a viewer with a `mask`,
    what a masked fix's arguments hide is masked here too, as replay masks it."""
    calls = [
        (c.call_id, c.tool_name, c.status, c.error, c.response_payload)
        for c in ToolCall.objects.filter(session=session, call_id__startswith="ev-").order_by(
            "position", "id"
        )
    ]
    snapshot = session.snapshot or {}
    if mask is not None:
        calls = [
            (i, tool, status, mask.text(error), mask.scrub(r))
            for i, tool, status, error, r in calls
        ]
        snapshot = mask.snapshot(snapshot)
    cause: dict[str, Any] = snapshot.get("root_cause") or {}
    saved = KnowledgeItem.objects.filter(session=session).values_list("key", flat=True).first()
    similar = linked_cases(session, language=scenario_language())
    panel = _panel(session, cause, calls, mask.scrub(similar) if mask is not None else similar)
    # searched by the evidence tool, or (a session recorded before it was one) when it
    # concluded
    searches = [error for _, tool, _, error, _ in calls if tool == "similar_cases"]
    panel["searched"] = any(not e for e in searches) or (bool(cause) and not searches)
    panel["search_failed"] = bool(searches) and all(searches)
    panel["run_mode"] = snapshot.get("run_mode") or {}
    panel["saved_as"] = saved
    panel["can_save"] = session.status == SessionStatus.COMPLETED and bool(cause) and not saved
    # the raw bundle is unmasked: offered to those who see the session unmasked
    panel["can_download"] = mask is None
    return {"diagnosis": panel}


def replay_context(session: Session, state: FoldState, mask: SessionMask | None) -> dict[str, Any]:
    """The panel as it stood at a replay step: the evidence calls logged by then (masked
    as replay masks every call), the root cause once found, the similar cases once
    recorded. Nothing to save from here."""
    calls = [
        (row["call_id"], row["tool_name"], row["status"], row["error"], row["result"])
        for row in evidence_calls(state, mask)
        if str(row["call_id"]).startswith("ev-")
    ]
    snapshot = mask.snapshot(state.snapshot) if mask is not None else state.snapshot
    cause: dict[str, Any] = snapshot.get("root_cause") or {}
    found = Event.objects.filter(session=session, type=SIMILAR, seq__lte=state.seq).exists()
    similar = linked_cases(session, language=scenario_language()) if found else []
    panel = _panel(session, cause, calls, mask.scrub(similar) if mask is not None else similar)
    failed = any(tool == "similar_cases" and error for _, tool, _, error, _ in calls)
    return {
        "diagnosis": {
            **panel,
            "run_mode": snapshot.get("run_mode") or {},
            "searched": found,
            "search_failed": failed,
            "saved_as": None,
            "can_save": False,
        }
    }


def _panel(
    session: Session,
    cause: dict[str, Any],
    calls: list[tuple[str, str, str, str, Any]],
    similar: list[dict[str, Any]],
) -> dict[str, Any]:
    lang = scenario_language()  # the reader's: the conclusion carries both
    evidence = [
        {
            "id": call_id,
            "tool": tool,
            "status": status,
            "error": error,
            "result": result or {},
            "cited": call_id in cause.get("evidence", []),
        }
        for call_id, tool, status, error, result in calls
    ]
    results: dict[str, Any] = {
        str(item["tool"]): item["result"] for item in evidence if not item["error"]
    }
    change = blamed_change(cause, results)
    anomalies = (results.get("anomalies") or {}).get("anomalies") or []
    charts = [
        chart
        for index, anomaly in enumerate(anomalies, start=1)
        if (chart := metric_chart(index, anomaly, change)) is not None
    ]
    return {
        "charts": charts,
        "graph": service_graph(
            demo_shop(), cause.get("service"), list(cause.get("related_services") or [])
        ),
        "cause": cause or None,
        "summary": (cause.get("summary") or {}).get(lang, ""),
        "evidence": evidence,
        "similar": similar,
        # Where the metrics were read from (the read_bundle call says): the file or a
        # configured Prometheus.
        "metrics_from": (results.get("read_bundle") or {}).get("metrics_from") or {},
        # The bundle's sources or the system's (the read_bundle call says).
        "evidence_from": (results.get("read_bundle") or {}).get("evidence_from") or {},
    }


@require_POST
@role_required(RUN_SESSIONS)
def save_knowledge(request: HtmxHttpRequest, session_id: UUID) -> Any:
    """Save a completed diagnosis into the knowledge base (operators and admins)."""
    session = get_session_for_user(request, session_id)
    try:
        item = do_save_as_knowledge(session.pk, request.user)
    except ActionError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, _("Saved to the knowledge base as %(id)s.") % {"id": item.key})
    return redirect("diagnosis:session-detail", session_id=session.pk)


@require_GET
@role_required(VIEW_SESSIONS)
def download_bundle(request: HtmxHttpRequest, session_id: UUID) -> Any:
    """The incident bundle the session was started from, as a zip (not for auditors: it
    is raw, and they read sessions masked)."""
    if not may_download_bundle(user_roles(request.user)):
        raise PermissionDenied(
            _("The bundle is raw data (unmasked): your role reads this session masked.")
        )
    session = get_session_for_user(request, session_id)
    response = bundle_response(session, request.user, via="web")
    if response is None:
        raise Http404(_("This session has no stored bundle."))
    return response
