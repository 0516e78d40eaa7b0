from __future__ import annotations

from django import forms


class ResolveTodoForm(forms.Form):
    note = forms.CharField(
        max_length=2000,
        strip=True,
        error_messages={"required": "Say what was done (a note is required)."},
    )
