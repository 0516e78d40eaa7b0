from __future__ import annotations

from django import forms
from django.utils.translation import gettext_lazy as _

from aero.text import MAX_NOTE, LimitedTextField


class ResolveTodoForm(forms.Form):
    note = LimitedTextField(
        what="note",
        max_length=MAX_NOTE,
        strip=True,
        error_messages={"required": _("Say what was done (a note is required).")},
    )
