from __future__ import annotations

from typing import Any

from django import forms

from aero.roles import user_roles


class TokenForm(forms.Form):
    name = forms.CharField(max_length=80, help_text="What the token is for, e.g. 'ci-pipeline'.")
    roles = forms.MultipleChoiceField(
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="Limit the token to some of your roles (none ticked: all of them).",
    )
    expires_in_days = forms.IntegerField(
        required=False, min_value=1, max_value=3650, help_text="Empty: until revoked."
    )

    def __init__(self, *args: Any, user: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        roles = self.fields["roles"]
        assert isinstance(roles, forms.MultipleChoiceField)
        roles.choices = [(r, r) for r in sorted(user_roles(user))]
