"""The scenario admin: a draft edited as rows (or, for a pack without a row editor, as
one YAML document) and published as numbered versions. Its other pages are
admin_pages.py's; the rows' inlines and forms, admin_inlines.py and admin_forms.py."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.translation import get_language, gettext_lazy
from django.utils.translation import gettext as _

from aero.packs import (
    DomainPack,
    UnknownDomain,
    added_as_yaml,
    edited_as_yaml,
    pack_for,
    row_edited,
)

# The provider admin registers itself; the admin's autodiscovery imports only this module.
from scenarios_admin import admin_providers  # noqa: F401
from scenarios_admin.actions import do_publish, draft_status
from scenarios_admin.admin_check import CheckedInlineFormSet, CrossCheck
from scenarios_admin.admin_forms import ScenarioForm, validate_scenario
from scenarios_admin.admin_inlines import FieldInline, ValueInline
from scenarios_admin.admin_pages import ScenarioPages
from scenarios_admin.admin_versions import ScenarioVersionInline
from scenarios_admin.admin_yaml import DefinitionYamlAddForm, DefinitionYamlForm
from scenarios_admin.draft import renumber, yaml_draft
from scenarios_admin.models import Scenario
from scenarios_admin.yamlio import dump_definition


@admin.register(Scenario)
class ScenarioAdmin(ScenarioPages):
    """A scenario's draft is edited here; publishing freezes it as a numbered version."""

    form = ScenarioForm
    list_display = ["slug", "name_en", "name_zh", "kind", "is_active", "latest", "draft"]
    list_filter = ["kind", "is_active"]
    search_fields = ["slug", "name_en", "name_zh"]
    actions = ["export_yaml"]
    # The draft's rows are edited by the inlines the scenario's pack lists (get_inlines).
    inlines = [ScenarioVersionInline]
    fieldsets = [
        (None, {"fields": ["slug", ("name_zh", "name_en"), "kind", "is_active"]}),
        (
            gettext_lazy("LLM providers"),
            {
                "classes": ["collapse"],
                "description": gettext_lazy(
                    "The model budget of one session: when it runs out the session asks an "
                    "approver to continue. Empty: the provider's budget, else none."
                ),
                "fields": ["system_prompt", ("budget_steps", "budget_tokens", "budget_cost")],
            },
        ),
        (
            gettext_lazy("Report template"),
            {"classes": ["collapse"], "fields": ["report_template_zh", "report_template_en"]},
        ),
    ]

    @admin.display(description=gettext_lazy("Published"))
    def latest(self, obj: Scenario) -> str:
        version = obj.latest_version()
        return f"v{version.number}" if version else "—"

    @admin.display(description=gettext_lazy("Draft"))
    def draft(self, obj: Scenario) -> str:
        return draft_status_text(obj, short=True)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        # The slug names the scenario in every published version and session.
        if _as_yaml(obj):
            return ["slug", "kind", "name_zh", "name_en"]
        return ["slug"] if obj is not None else []

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        adding = _adding_kind(request, obj)
        if not (_as_yaml(obj) or adding):
            return super().get_fieldsets(request, obj)
        kind = obj.kind if obj is not None else adding
        schema_url = reverse("admin:scenarios_admin_scenario_schema") + f"?kind={kind}"
        identity = (
            ["slug", ("name_zh", "name_en"), "kind", "is_active"]
            if obj is not None
            else ["is_active"]  # the new scenario's slug, kind and name are in its YAML
        )
        return [
            (None, {"fields": identity}),
            (
                gettext_lazy("Definition"),
                {
                    "description": format_html(
                        '{} <a href="{}" data-testid="definition-schema">{}</a>',
                        _(
                            "Its pack has no row editor: the definition is edited as YAML "
                            "and checked on save. Every key, type and limit:"
                        ),
                        schema_url,
                        _("the JSON Schema of this kind"),
                    ),
                    "fields": ["definition_yaml"],
                },
            ),
        ]

    @admin.display(description=gettext_lazy("Definition (YAML)"))
    def definition_yaml(self, obj: Scenario) -> str:
        # What a viewer (no change permission) reads in place of the editor.
        draft = yaml_draft(obj)
        return format_html("<pre>{}</pre>", dump_definition(draft) if draft else "")

    def get_inlines(self, request: HttpRequest, obj: Any) -> list[Any]:
        # The versions stay listed; the draft rows are the row editor's.
        if _adding_kind(request, obj):
            return []
        if _as_yaml(obj):
            return [ScenarioVersionInline]
        return [*_row_inlines(request, obj), ScenarioVersionInline]

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        adding = _adding_kind(request, obj)
        if adding:
            form = type("DefinitionYamlAddForm", (DefinitionYamlAddForm,), {"kind": adding})
            return super().get_form(request, obj, change, form=form, **kwargs)
        if _as_yaml(obj):
            return super().get_form(request, obj, change, form=DefinitionYamlForm, **kwargs)
        form = super().get_form(request, obj, change, **kwargs)
        check = CrossCheck.of(request, validate_scenario)
        return type(form.__name__, (form,), {"cross_check": check})

    def get_formset_kwargs(
        self, request: HttpRequest, obj: Any, inline: Any, prefix: str
    ) -> dict[str, Any]:
        kwargs = super().get_formset_kwargs(request, obj, inline, prefix)
        if issubclass(inline.formset, CheckedInlineFormSet):
            kwargs["cross_check"] = CrossCheck.of(request, validate_scenario)
        return kwargs

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        super().save_related(request, form, formsets, change)
        if isinstance(form, DefinitionYamlAddForm):
            # Checked by the form (its model and its example cases): version 1 at once,
            # in the page's transaction, with its scenario.published audit entry.
            version = do_publish(form.instance, user=request.user, note="added in the admin")
            self.message_user(
                request,
                _("Added %(slug)s and published it as version %(n)s.")
                % {"slug": form.instance.slug, "n": version.number},
                messages.SUCCESS,
            )
            return
        renumber(form.instance)
        latest, changed = draft_status(form.instance)
        if changed:
            serving = (
                _("version %(n)s") % {"n": latest.number}
                if latest
                else _("no version (never published)")
            )
            self.message_user(
                request,
                _("Draft saved. New sessions keep using %(serving)s until you publish.")
                % {"serving": serving},
                messages.INFO,
            )

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Any = None,
    ) -> HttpResponse:
        check: CrossCheck | None = getattr(request, "_aero_cross_check", None)
        context["draft_issues"] = check.summary if check is not None else []
        context["as_yaml"] = _as_yaml(obj) or bool(_adding_kind(request, obj))
        if not context["as_yaml"]:
            pack = _row_pack(request, obj)
            context["row_help"] = pack.row_help_template if pack is not None else None
        if add and not context["as_yaml"]:
            # The kinds written as YAML are added from their own page.
            language = "zh" if (get_language() or "").startswith("zh") else "en"
            context["yaml_kinds"] = [
                (pack.label.get(language, pack.label["en"]), pack.kind) for pack in added_as_yaml()
            ]
        if obj is not None:
            context["draft_status"] = draft_status_text(obj)
            context["can_publish"] = self._can_publish(request, obj)
        return super().render_change_form(request, context, add, change, form_url, obj)


def _as_yaml(obj: Any) -> bool:
    return isinstance(obj, Scenario) and edited_as_yaml(obj.kind)


def _row_pack(request: HttpRequest, obj: Any) -> DomainPack | None:
    """The pack whose row editor the page shows: the scenario's (of the kind posted or,
    on a new page, the first pack edited as rows); None for a kind no pack serves."""
    kind = obj.kind if isinstance(obj, Scenario) else request.POST.get("kind", "")
    if not kind:
        editors = row_edited()
        kind = editors[0].kind if editors else ""
    try:
        return pack_for(kind)
    except UnknownDomain:
        return None


def _row_inlines(request: HttpRequest, obj: Any) -> list[Any]:
    """The row editor's inlines of the page's pack; a kind no pack serves: its fields
    only."""
    pack = _row_pack(request, obj)
    return list((pack.row_inlines if pack is not None else ()) or (ValueInline, FieldInline))


def _adding_kind(request: HttpRequest, obj: Any) -> str:
    """The kind the add page writes as YAML (`?kind=`), else "" (the row editor)."""
    if obj is not None:
        return ""
    kind = request.GET.get("kind", "")
    return kind if kind in {pack.kind for pack in added_as_yaml()} else ""


def draft_status_text(scenario: Scenario, *, short: bool = False) -> str:
    latest, changed = draft_status(scenario)
    if latest is None:
        return _("never published") if short else _("This scenario has never been published.")
    if not changed:
        return (
            f"= v{latest.number}"
            if short
            else _("The draft is the same as version %(n)s, which new sessions use.")
            % {"n": latest.number}
        )
    return (
        _("unpublished changes")
        if short
        else _(
            "The draft has changes that are not published: new sessions use version "
            "%(n)s until you publish."
        )
        % {"n": latest.number}
    )
