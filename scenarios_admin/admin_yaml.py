"""The admin's form for a scenario edited as one YAML document (a pack without a row
editor), on its change page and its add page."""

from __future__ import annotations

import copy
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from aero.packs import pack_for
from scenarios_admin.actions import run_publish_checks
from scenarios_admin.draft import yaml_draft
from scenarios_admin.models import Scenario
from scenarios_admin.schema import definition_issues
from scenarios_admin.yamlio import dump_definition, load_yaml, locate


class DefinitionYamlForm(forms.ModelForm[Any]):
    """A scenario whose pack has no row editor (aero.packs edited_as_yaml): its whole
    definition as YAML, checked by the pack's model. A problem is shown with its line and
    path (`line 12: playbook.window_minutes: ...`), and nothing is saved until none is left."""

    definition_yaml = forms.CharField(
        label=gettext_lazy("Definition (YAML)"),
        widget=forms.Textarea(attrs={"rows": 40, "cols": 100, "spellcheck": "false"}),
        help_text=gettext_lazy(
            "The whole definition, as exported. Saving keeps a draft; sessions run a "
            "published version."
        ),
    )

    class Meta:
        model = Scenario
        fields = ["is_active"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.is_bound:
            self.initial["definition_yaml"] = self.starting_text()
        self.definition: dict[str, Any] | None = None

    def starting_text(self) -> str:
        draft = yaml_draft(self.instance)
        return dump_definition(draft) if draft else ""

    def clean_definition_yaml(self) -> str:
        text: str = self.cleaned_data["definition_yaml"].replace("\r\n", "\n")
        data, unreadable = load_yaml(text)
        if unreadable:
            raise ValidationError([str(issue) for issue in unreadable])
        if not isinstance(data, dict):
            raise ValidationError(_("The definition must be a mapping (key: value lines)."))
        fixed = self.identity_problems(data)
        if fixed:
            raise ValidationError(fixed)
        issues = definition_issues(data)
        if issues:
            raise ValidationError([str(issue) for issue in locate(issues, text)])
        self.definition = data
        return text

    def identity_problems(self, data: dict[str, Any]) -> list[str]:
        """The slug and kind name this scenario in every version and session: they stay."""
        scenario = self.instance
        return [
            _("%(key)s: is %(given)s; this scenario's is %(own)s (it cannot change here)")
            % {"key": key, "given": data.get(key), "own": getattr(scenario, key)}
            for key in ("slug", "kind")
            if data.get(key) != getattr(scenario, key)
        ]

    def save(self, commit: bool = True) -> Scenario:
        scenario: Scenario = super().save(commit=False)
        if self.definition is not None:
            scenario.definition_draft = self.definition
            scenario.name_zh = self.definition["name"]["zh"]
            scenario.name_en = self.definition["name"]["en"]
        if commit:
            scenario.save()
        return scenario


class DefinitionYamlAddForm(DefinitionYamlForm):
    """A new scenario of a kind written as YAML (the admin's add page, `?kind=`): the
    editor starts from the kind's shipped definition (aero.packs starting_definition)
    under a free slug and a new name. Saved only once the pack's model and its example
    cases pass; the admin then publishes it as version 1."""

    kind = ""  # set by the admin for the kind chosen

    def starting_text(self) -> str:
        return dump_definition(starting_definition(self.kind))

    def identity_problems(self, data: dict[str, Any]) -> list[str]:
        problems = []
        if data.get("kind") != self.kind:
            problems.append(
                _("kind: is %(given)s; this page adds a scenario of kind %(kind)s")
                % {"given": data.get("kind"), "kind": self.kind}
            )
        slug = data.get("slug")
        if isinstance(slug, str) and Scenario.objects.filter(slug=slug).exists():
            problems.append(
                _("slug: %(slug)s is taken by another scenario; choose another") % {"slug": slug}
            )
        return problems

    def clean(self) -> dict[str, Any] | None:
        cleaned = super().clean()
        if self.definition is not None:
            # Version 1 is published with the page's save: its self-check runs first, so
            # a definition whose example cases fail saves nothing.
            failures = run_publish_checks(self.definition)
            if failures:
                self.add_error(
                    "definition_yaml",
                    [_("The example cases fail, so nothing was saved:"), *failures],
                )
                self.definition = None
        return cleaned

    def save(self, commit: bool = True) -> Scenario:
        scenario = super().save(commit=False)
        if self.definition is not None:
            scenario.slug = self.definition["slug"]
            scenario.kind = self.kind
        if commit:
            scenario.save()
        return scenario


def starting_definition(kind: str) -> dict[str, Any]:
    """The kind's shipped definition under the first free slug (`<slug>_2`, ...) and a
    name that says it is new."""
    pack = pack_for(kind)
    assert pack.starting_definition is not None
    definition = copy.deepcopy(pack.starting_definition())
    base = str(definition["slug"])
    taken = set(Scenario.objects.filter(slug__startswith=base).values_list("slug", flat=True))
    number = 2
    while f"{base}_{number}" in taken:
        number += 1
    definition["slug"] = f"{base}_{number}"
    names = definition.get("name") or {}
    definition["name"] = {
        "zh": f"{names.get('zh', base)}（新 {number}）",
        "en": f"{names.get('en', base)} (new {number})",
    }
    return definition
