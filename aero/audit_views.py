"""The audit log for auditors and admins: filter by actor, action, object and date, page
through it with a keyset cursor (newest first), download what matches as CSV."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterator
from datetime import datetime, time, timedelta
from typing import Any

from django import forms
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import render
from django.utils import timezone
from django.utils.translation import gettext_lazy as _
from django.views.decorators.http import require_GET

from aero.models import AuditLog, audit
from aero.roles import READ_AUDIT_LOG, role_required

PAGE = 50
CSV_COLUMNS = (
    "time",
    "actor",
    "action",
    "object_type",
    "object_id",
    "session",
    "detail",
    "digest",
)
# A spreadsheet runs a cell starting with one of these as a formula (CSV injection).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


class AuditFilterForm(forms.Form):
    actor = forms.CharField(
        required=False, label=_("Actor"), max_length=150, help_text=_("Username, exactly.")
    )
    action = forms.CharField(
        required=False,
        label=_("Action"),
        max_length=80,
        help_text=_("An action or its start: approval. finds every decision."),
    )
    object = forms.CharField(
        required=False,
        label=_("Object"),
        max_length=170,
        help_text=_("type:id (approvals.approval:12), a type, or an id."),
    )
    date_from = forms.DateField(
        required=False, label=_("From"), widget=forms.DateInput({"type": "date"})
    )
    date_to = forms.DateField(
        required=False, label=_("To"), widget=forms.DateInput({"type": "date"})
    )
    after = forms.CharField(required=False, widget=forms.HiddenInput)

    def clean_after(self) -> tuple[datetime, int] | None:
        value = self.cleaned_data["after"]
        if not value:
            return None
        stamp, _sep, pk = value.rpartition("_")
        try:
            when = datetime.fromisoformat(stamp)
            return when, int(pk)
        except ValueError:
            raise forms.ValidationError(
                _("This page link is broken: start from the newest.")
            ) from None

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        start, end = data.get("date_from"), data.get("date_to")
        if start and end and start > end:
            self.add_error("date_to", _("The end date is before the start date."))
        return data

    def filtered(self) -> QuerySet[AuditLog]:
        """Entries matching the filters, newest first (no cursor)."""
        data = self.cleaned_data
        entries = AuditLog.objects.select_related(None).order_by("-created_at", "-id")
        if data.get("actor"):
            entries = entries.filter(actor_label__iexact=data["actor"].strip())
        if data.get("action"):
            entries = entries.filter(action__startswith=data["action"].strip())
        if data.get("object"):
            entries = entries.filter(object_filter(data["object"].strip()))
        if data.get("date_from"):
            entries = entries.filter(created_at__gte=day_start(data["date_from"]))
        if data.get("date_to"):
            entries = entries.filter(created_at__lt=day_start(data["date_to"] + timedelta(days=1)))
        return entries


def object_filter(value: str) -> Q:
    kind, colon, pk = value.partition(":")
    if colon:
        return Q(object_type__iexact=kind.strip(), object_id=pk.strip())
    return Q(object_type__iexact=value) | Q(object_id=value)


def day_start(day: Any) -> datetime:
    return timezone.make_aware(datetime.combine(day, time.min))


def cursor_of(entry: AuditLog) -> str:
    return f"{entry.created_at.isoformat()}_{entry.pk}"


@require_GET
@role_required(READ_AUDIT_LOG)
def audit_log(request: HttpRequest) -> HttpResponse:
    form = AuditFilterForm(request.GET or None)
    entries: list[AuditLog] = []
    next_cursor = ""
    if form.is_bound and not form.is_valid():
        status = 400
    else:
        status = 200
        if not form.is_bound:
            form = AuditFilterForm({})
            form.is_valid()
        page = form.filtered()
        after = form.cleaned_data.get("after")
        if after is not None:
            when, pk = after
            page = page.filter(Q(created_at__lt=when) | Q(created_at=when, id__lt=pk))
        entries = list(page[: PAGE + 1])
        if len(entries) > PAGE:
            entries = entries[:PAGE]
            next_cursor = cursor_of(entries[-1])
        masks = viewer_masks(request.user)
        if masks is not None:
            for entry in entries:  # shown, never saved
                entry.detail = masks(entry.session_id, entry.detail)
    query = request.GET.copy()
    query.pop("after", None)
    next_query = query.copy()
    next_query["after"] = next_cursor
    return render(
        request,
        "aero/audit.html",
        {
            "form": form,
            "entries": entries,
            "filters": query.urlencode(),
            "next_query": next_query.urlencode() if next_cursor else "",
            "first_page": "after" not in request.GET,
        },
        status=status,
    )


# How an entry's detail reads for a viewer: (session id, detail) -> detail as shown.
DetailMask = Callable[[Any, dict[str, Any]], dict[str, Any]]
# The app that knows what a read-only viewer may not see (the sessions' masking rule)
# registers, at ready, the mask for a viewer (None: the viewer sees details whole); the
# kernel imports no app.
_detail_masks: list[Callable[[Any], DetailMask | None]] = []


def register_detail_mask(for_viewer: Callable[[Any], DetailMask | None]) -> None:
    if for_viewer not in _detail_masks:
        _detail_masks.append(for_viewer)


def viewer_masks(user: Any) -> DetailMask | None:
    for for_viewer in _detail_masks:
        mask = for_viewer(user)
        if mask is not None:
            return mask
    return None


def safe_cell(value: Any) -> str:
    """Text a spreadsheet shows as text: a leading formula character gets a quote."""
    text = "" if value is None else str(value)
    return "'" + text if text.startswith(FORMULA_STARTS) else text


class _Echo:
    def write(self, value: str) -> str:
        return value


def csv_rows(entries: QuerySet[AuditLog], masks: DetailMask | None = None) -> Iterator[str]:
    """`masks`: for a read-only viewer, the details as masking shows them."""
    writer = csv.writer(_Echo())
    yield writer.writerow(CSV_COLUMNS)
    for entry in entries.iterator(chunk_size=2000):
        detail = masks(entry.session_id, entry.detail) if masks else entry.detail
        yield writer.writerow(
            [
                safe_cell(value)
                for value in (
                    entry.created_at.isoformat(),
                    entry.actor_label,
                    entry.action,
                    entry.object_type,
                    entry.object_id,
                    entry.session_id or "",
                    json.dumps(detail, ensure_ascii=False, sort_keys=True),
                    entry.digest,
                )
            ]
        )


@require_GET
@role_required(READ_AUDIT_LOG)
def audit_csv(request: HttpRequest) -> HttpResponseBase:
    form = AuditFilterForm(request.GET)
    if not form.is_valid():
        return render(
            request,
            "aero/audit.html",
            {"form": form, "entries": [], "filters": "", "first_page": True},
            status=400,
        )
    filters = {k: v for k, v in request.GET.items() if k in form.fields and k != "after" and v}
    # Exporting the audit log is itself audited, before the first byte leaves.
    audit("audit.exported", object_type="aero.auditlog", actor=request.user, detail=filters)
    stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
    response = StreamingHttpResponse(
        csv_rows(form.filtered(), viewer_masks(request.user)),
        content_type="text/csv; charset=utf-8",
    )
    response["Content-Disposition"] = f'attachment; filename="aero-audit-{stamp}.csv"'
    return response
