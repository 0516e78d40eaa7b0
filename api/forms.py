from __future__ import annotations

from typing import Any

from django import forms
from django.utils.translation import gettext_lazy as _

from aero.roles import ROLE_LABELS, user_roles


class TokenForm(forms.Form):
    name = forms.CharField(
        label=_("Name"), max_length=80, help_text=_("What the token is for, e.g. 'ci-pipeline'.")
    )
    roles = forms.MultipleChoiceField(
        label=_("Roles"),
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text=_("Limit the token to some of your roles (none ticked: all of them)."),
    )
    expires_in_days = forms.IntegerField(
        label=_("Expires in days"),
        required=False,
        min_value=1,
        max_value=3650,
        help_text=_("Empty: until revoked."),
    )

    def __init__(self, *args: Any, user: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        roles = self.fields["roles"]
        assert isinstance(roles, forms.MultipleChoiceField)
        roles.choices = [(r, ROLE_LABELS.get(r, r)) for r in sorted(user_roles(user))]
