from __future__ import annotations

from typing import Any

from django import forms
from django.urls import reverse_lazy
from django.utils.translation import gettext_lazy as _

from aero.packs import installed_packs
from aero.text import MAX_LIFT_NOTE, MAX_MESSAGE, MAX_REASON, LimitedTextField
from scenarios_admin.models import Scenario


class NewSessionForm(forms.Form):
    scenario = forms.ModelChoiceField(
        queryset=Scenario.objects.filter(is_active=True, versions__isnull=False).distinct(),
        # Nothing preselected: a preselected scenario once asked an oil spill about a
        # bird strike's phase. Left empty, the form suggests one from the message.
        empty_label=_("— choose, or let AERO suggest from the message —"),
        required=False,
        label=_("Scenario"),
    )
    # Set by the "open it anyway" button after AERO said another scenario fits better.
    keep_scenario = forms.BooleanField(required=False, widget=forms.HiddenInput)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Only the kinds whose sessions start from a message (not an evidence file).
        field = self.fields["scenario"]
        assert isinstance(field, forms.ModelChoiceField)
        field.queryset = field.queryset.filter(  # type: ignore[union-attr]
            kind__in=[p.kind for p in installed_packs() if p.opens_from_message]
        )

    message = LimitedTextField(
        what="message",
        widget=forms.Textarea(
            attrs={
                "rows": 4,
                # While the operator types, the select takes the scenario the message reads
                # like (the operator's own choice is kept), so one press opens the session.
                "hx-get": reverse_lazy("diagnosis:session-suggest"),
                "hx-trigger": "input changed delay:300ms",
                "hx-include": "#id_scenario, #id_suggested",
                "hx-target": "#scenario-choice",
                "hx-swap": "outerHTML",
                "hx-sync": "this:replace",
                "placeholder": _(
                    "Describe the incident in Chinese or English, "
                    "e.g. CA1234 在105机位燃油泄漏，发动机仍在运转"
                ),
            }
        ),
        max_length=MAX_MESSAGE,
        strip=True,
        error_messages={"required": _("Please describe the incident: the message is empty.")},
    )


class AnswerForm(forms.Form):
    message = LimitedTextField(
        what="answer",
        max_length=MAX_MESSAGE,
        strip=True,
        error_messages={"required": _("Please type an answer: the message is empty.")},
    )


class LiftForm(forms.Form):
    note = LimitedTextField(
        what="note",
        max_length=MAX_LIFT_NOTE,
        strip=True,
        error_messages={"required": _("Say why the restriction is lifted (a note is required).")},
    )


class DeleteSessionForm(forms.Form):
    reason = LimitedTextField(
        what="reason",
        max_length=MAX_REASON,
        strip=True,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        error_messages={"required": _("Say why the session is deleted (a reason is required).")},
    )
    confirm = forms.BooleanField(
        label=_("I understand: the session leaves every list and cannot be restored here."),
        error_messages={"required": _("Tick the box to confirm the delete.")},
    )
