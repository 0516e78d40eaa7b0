from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.auth.models import User
from django.utils.translation import gettext_lazy as _

from aero.packs import history_filters
from diagnosis.models import SessionStatus
from diagnosis.wording import RISK_LABELS
from scenarios_admin.models import Scenario

# Event-type groups for the replay filter: label and the type prefixes they cover.
EVENT_GROUPS: dict[str, tuple[Any, tuple[str, ...]]] = {
    "session": (_("Session and messages"), ("session.", "user.")),
    "agent": (_("Agent steps and compliance"), ("agent.", "fsm.")),
    "findings": (
        _("Fields, risk, impact, report"),
        ("fields.", "finding.", "risk.", "impact.", "timeline.", "report."),
    ),
    "tools": (_("Tool calls"), ("tool.",)),
    "approvals": (_("Approvals"), ("approval.",)),
    "llm": (_("Model calls and usage"), ("llm.", "metrics.")),
}
SPEEDS = ("0.5", "1", "2", "4", "8")  # steps per second
RISK_LEVELS = ("LOW", "MEDIUM", "HIGH")
HISTORY_SORTS = {
    "-created": _("Newest first"),
    "created": _("Oldest first"),
    "-updated": _("Recently changed"),
}


class ReplayForm(forms.Form):
    """Where the player stands and what it steps through. Every field is optional."""

    seq = forms.IntegerField(required=False, min_value=0)
    at = forms.DateTimeField(required=False, label=_("Jump to time"))
    groups = forms.MultipleChoiceField(
        required=False,
        choices=[(k, label) for k, (label, _prefixes) in EVENT_GROUPS.items()],
        widget=forms.CheckboxSelectMultiple,
        label=_("Event types"),
    )
    run = forms.IntegerField(required=False, min_value=1, label=_("Agent run subtree"))
    since = forms.DateTimeField(required=False, label=_("From"))
    until = forms.DateTimeField(required=False, label=_("To"))
    play = forms.ChoiceField(
        required=False, choices=[("", _("paused")), *[(s, f"{s}/s") for s in SPEEDS]]
    )
    after = forms.IntegerField(required=False, min_value=0)
    before = forms.IntegerField(required=False, min_value=1)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        since, until = data.get("since"), data.get("until")
        if since and until and since > until:
            self.add_error("until", _("The end of the time range is before its start."))
        return data


class HistoryForm(forms.Form):
    q = forms.CharField(required=False, max_length=200, label=_("Text"))
    scenario = forms.ModelChoiceField(
        required=False,
        queryset=Scenario.objects.order_by("slug"),
        to_field_name="slug",
        empty_label=_("any"),  # as the other filters (Django's own reads "- Select an option -")
    )
    status = forms.ChoiceField(required=False, choices=[("", _("any")), *SessionStatus.choices])
    risk = forms.ChoiceField(
        required=False, choices=[("", _("any")), *[(r, RISK_LABELS[r]) for r in RISK_LEVELS]]
    )
    creator = forms.CharField(required=False, max_length=150, label=_("Opened by"))
    since = forms.DateField(required=False, label=_("From"))
    until = forms.DateField(required=False, label=_("To"))
    sort = forms.ChoiceField(required=False, choices=list(HISTORY_SORTS.items()))
    cursor = forms.CharField(required=False, max_length=100)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The installed packs' own filters (an IT diagnosis's problem type and service,
        # chosen; the apron's flight and position, typed in).
        for name, item in history_filters().items():
            self.fields[name] = (
                forms.ChoiceField(
                    required=False, label=item.label, choices=[("", _("any")), *item.choices()]
                )
                if item.choices is not None
                else forms.CharField(required=False, max_length=item.max_length, label=item.label)
            )

    def pack_fields(self) -> list[forms.BoundField]:
        """The packs' filters shown beside the scenario (those with choices)."""
        return [self[name] for name, item in history_filters().items() if not item.column]

    def column_fields(self) -> list[forms.BoundField]:
        """The packs' filters with a column of their own in the results."""
        return [self[name] for name, item in history_filters().items() if item.column]

    def clean_cursor(self) -> str:
        from replay.history import parse_cursor

        cursor = str(self.cleaned_data.get("cursor") or "")
        if cursor:
            try:
                parse_cursor(cursor)
            except ValueError:
                raise forms.ValidationError(
                    _("This page link is broken: start from the first page.")
                ) from None
        return cursor

    def clean_creator(self) -> str:
        name = str(self.cleaned_data.get("creator") or "").strip()
        if name and not User.objects.filter(username=name).exists():
            raise forms.ValidationError(_("No user is called “%(name)s”.") % {"name": name})
        return name

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        for name, item in history_filters().items():
            if item.choices is None and name in data:
                data[name] = item.clean(str(data[name] or ""))
        since, until = data.get("since"), data.get("until")
        if since and until and since > until:
            self.add_error("until", _("The end of the date range is before its start."))
        return data
