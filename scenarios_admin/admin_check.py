"""The cross-check of the admin's change forms: a form and all its inline rows validated
as one document before anything is saved, each problem placed on its row and column."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest
from django.utils.translation import ngettext


class CrossCheck:
    """Validates a change form and its inline formsets together, once each has validated
    its own rows. The admin passes one CrossCheck per request to the form and to every
    checked formset; the first formset to clean runs it (Django validates the form, then
    the formsets in order, then saves only if all are valid). Errors land on the rows and
    columns they concern, and a summary is kept for the top of the page."""

    def __init__(self, validate: Callable[[CrossCheck], list[str]]) -> None:
        self.validate = validate
        self.form: forms.ModelForm[Any] | None = None
        self.formsets: list[CheckedInlineFormSet] = []
        self.summary: list[str] = []
        self._state = "new"

    @classmethod
    def of(cls, request: HttpRequest, validate: Callable[[CrossCheck], list[str]]) -> CrossCheck:
        check: CrossCheck | None = getattr(request, "_aero_cross_check", None)
        if check is None:
            check = cls(validate)
            request._aero_cross_check = check  # type: ignore[attr-defined]
        return check

    def formset(self, model: type[Any]) -> CheckedInlineFormSet | None:
        return next((fs for fs in self.formsets if fs.model is model), None)

    def run(self) -> None:
        if self._state != "new":
            return
        self._state = "running"
        try:
            # Row-level errors first: the document is only checked when every row is valid.
            rows_valid = all([fs.is_valid() for fs in self.formsets])
            if self.form is None or not self.form.is_valid() or not rows_valid:
                return
            self.summary = self.validate(self)
        finally:
            self._state = "done"
        if self.summary:
            raise ValidationError(
                ngettext(
                    "Nothing was saved: %(n)d problem, listed at the top of the page and "
                    "marked on its row.",
                    "Nothing was saved: %(n)d problems, listed at the top of the page and "
                    "marked on their rows.",
                    len(self.summary),
                )
                % {"n": len(self.summary)}
            )


class CheckedInlineFormSet(BaseInlineFormSet):
    def __init__(self, *args: Any, cross_check: CrossCheck | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cross_check = cross_check
        if cross_check is not None:
            cross_check.formsets.append(self)

    def clean(self) -> None:
        super().clean()
        if self.cross_check is not None:
            self.cross_check.run()

    def live_forms(self) -> list[forms.ModelForm[Any]]:
        """The rows the save would keep, in their display order (position, then as listed)."""
        live = [
            form
            for form in self.forms
            if not (self.can_delete and form.cleaned_data.get("DELETE", False))
            and (form.instance.pk is not None or form.has_changed())
        ]
        if "position" in self.form.base_fields:
            indexed = list(enumerate(live))
            indexed.sort(
                key=lambda pair: (
                    pair[1].cleaned_data.get("position") is None,
                    pair[1].cleaned_data.get("position") or 0,
                    pair[0],
                )
            )
            live = [form for _, form in indexed]
        return live


def place_problem(
    form: forms.BaseForm, column: str | None, message: str, label: str, verbose: str = ""
) -> str:
    if column is not None and column in form.fields:
        form.add_error(column, message)
        verbose = verbose or str(form.fields[column].label or column)
        return f"{label}, {verbose.lower()}: {message}"
    form.add_error(None, message)
    return f"{label}: {message}"
