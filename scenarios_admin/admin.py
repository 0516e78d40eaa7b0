from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import F, OuterRef, QuerySet, Subquery
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.translation import get_language, gettext_lazy
from django.utils.translation import gettext as _

from aero.models import audit
from aero.packs import UnknownDomain, added_as_yaml, edited_as_yaml, pack_for

# The provider admin registers itself; the admin's autodiscovery imports only this module.
from scenarios_admin import admin_providers  # noqa: F401
from scenarios_admin.actions import (
    NothingToPublish,
    ScenarioError,
    do_import,
    do_publish,
    draft_status,
    export_text,
    run_publish_checks,
)
from scenarios_admin.admin_forms import (
    CheckedInlineFormSet,
    CrossCheck,
    DefinitionYamlAddForm,
    DefinitionYamlForm,
    FieldValueForm,
    RiskRuleForm,
    ScenarioActionForm,
    ScenarioExampleForm,
    ScenarioFieldForm,
    ScenarioForm,
    validate_scenario,
)
from scenarios_admin.admin_versions import (
    ScenarioVersionInline,
    diff_against_latest,
    diff_lines,
    latest_yaml,
    side_label,
    yaml_response,
)
from scenarios_admin.draft import assemble, renumber, yaml_draft
from scenarios_admin.models import (
    FieldValue,
    RiskRule,
    Scenario,
    ScenarioAction,
    ScenarioExample,
    ScenarioField,
    SpreadRadius,
)
from scenarios_admin.schema import definition_json_schema
from scenarios_admin.yamlio import dump_definition

# --- scenarios: the draft, edited as rows -------------------------------------------------


class FieldInline(admin.StackedInline[ScenarioField, Scenario]):
    model = ScenarioField
    classes = ["collapse"]
    form = ScenarioFieldForm
    formset = CheckedInlineFormSet
    extra = 0
    verbose_name_plural = gettext_lazy(
        "Fields (the checklist: P1 fields are asked for before risk assessment)"
    )
    fieldsets = [
        (
            None,
            {
                "fields": [
                    ("position", "name", "type", "priority"),
                    ("label_zh", "label_en"),
                    ("ask_zh", "ask_en"),
                    "kinds",
                    ("default", "measure_units", "measure_bands"),
                ]
            },
        )
    ]


class ValueInline(admin.TabularInline[FieldValue, Scenario]):
    model = FieldValue
    form = FieldValueForm
    formset = CheckedInlineFormSet
    extra = 0
    fields = ["position", "field", "value", "label_zh", "label_en", "synonyms", "fallback"]
    verbose_name_plural = gettext_lazy(
        "Values of enum and bool fields, with the synonyms the extractor reads"
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet[FieldValue]:
        field_position = ScenarioField.objects.filter(
            scenario=OuterRef("scenario"), name=OuterRef("field")
        ).values("position")[:1]
        return (
            super()
            .get_queryset(request)
            .annotate(field_position=Subquery(field_position))
            .order_by(F("field_position").asc(nulls_last=True), "field", "position", "id")
        )


class RuleInline(admin.TabularInline[RiskRule, Scenario]):
    model = RiskRule
    form = RiskRuleForm
    formset = CheckedInlineFormSet
    extra = 0
    fields = ["position", "rule_id", "condition", "level", "score"]
    verbose_name_plural = gettext_lazy(
        "Risk rules (first match wins; the last one has an empty condition)"
    )


class RadiusInline(admin.TabularInline[SpreadRadius, Scenario]):
    model = SpreadRadius
    classes = ["collapse"]
    formset = CheckedInlineFormSet
    extra = 0
    fields = ["key_value", "level", "hops"]
    verbose_name_plural = gettext_lazy(
        "Spread radius (hops of the impact analysis, by value and level)"
    )


class ActionInline(admin.TabularInline[ScenarioAction, Scenario]):
    model = ScenarioAction
    form = ScenarioActionForm
    formset = CheckedInlineFormSet
    extra = 0
    fields = ["position", "tool", "risk_class", "condition", "for_each", "args"]
    verbose_name_plural = gettext_lazy(
        "Required actions (proposed in this order when their condition holds)"
    )


class ExampleInline(admin.TabularInline[ScenarioExample, Scenario]):
    model = ScenarioExample
    classes = ["collapse"]
    form = ScenarioExampleForm
    formset = CheckedInlineFormSet
    extra = 0
    fields = ["position", "text", "expected_fields", "rule", "level", "actions"]
    verbose_name_plural = gettext_lazy(
        "Example cases (the self-check: all must pass before publishing)"
    )


class PublishForm(forms.Form):
    note = forms.CharField(
        max_length=200,
        required=False,
        help_text=gettext_lazy("What changed (shown in the version list)."),
    )


class ImportForm(forms.Form):
    file = forms.FileField(help_text=gettext_lazy("One scenario as exported (UTF-8 YAML)."))
    publish = forms.BooleanField(
        required=False,
        help_text=gettext_lazy("Publish it too (after validation and the self-check)."),
    )
    note = forms.CharField(max_length=200, required=False)


@admin.register(Scenario)
class ScenarioAdmin(admin.ModelAdmin[Scenario]):
    """A scenario's draft is edited here; publishing freezes it as a numbered version."""

    form = ScenarioForm
    list_display = ["slug", "name_en", "name_zh", "kind", "is_active", "latest", "draft"]
    list_filter = ["kind", "is_active"]
    search_fields = ["slug", "name_en", "name_zh"]
    actions = ["export_yaml"]
    # Most edited first (synonyms, rules, actions), the rest folded: with everything
    # open the page is very long. A section with errors opens by itself.
    inlines = [
        ValueInline,
        RuleInline,
        ActionInline,
        FieldInline,
        RadiusInline,
        ExampleInline,
        ScenarioVersionInline,
    ]
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
            gettext_lazy("Impact analysis"),
            {"fields": [("impact_start", "radius_key", "default_radius")]},
        ),
        (
            gettext_lazy("Compliance state machine"),
            {
                "classes": ["collapse"],
                "description": gettext_lazy(
                    "The six states a session passes through, in order. The agent may only "
                    "assess risk once all P1 fields are known, propose actions after the "
                    "impact analysis, and report once every action is decided."
                ),
                "fields": [("state_1", "state_2", "state_3"), ("state_4", "state_5", "state_6")],
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
        return [ScenarioVersionInline] if _as_yaml(obj) else list(self.inlines)

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

    def _can_publish(self, request: HttpRequest, obj: Scenario) -> bool:
        return self.has_change_permission(request, obj) and request.user.has_perm(
            "scenarios_admin.add_scenarioversion"
        )

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view
        return [
            path("import/", view(self.import_view), name="scenarios_admin_scenario_import"),
            path("schema.json", view(self.schema_view), name="scenarios_admin_scenario_schema"),
            path(
                "<path:object_id>/publish/",
                view(self.publish_view),
                name="scenarios_admin_scenario_publish",
            ),
            path(
                "<path:object_id>/diff/", view(self.diff_view), name="scenarios_admin_scenario_diff"
            ),
            path(
                "<path:object_id>/export/",
                view(self.export_view),
                name="scenarios_admin_scenario_export",
            ),
            *super().get_urls(),
        ]

    def _scenario(self, request: HttpRequest, object_id: str) -> Scenario:
        scenario = self.get_object(request, object_id)
        if scenario is None:
            raise Http404("No such scenario.")
        return scenario

    def _page(self, request: HttpRequest, template: str, **context: Any) -> TemplateResponse:
        return TemplateResponse(
            request,
            f"admin/scenarios_admin/scenario/{template}",
            {**self.admin_site.each_context(request), "opts": self.opts, **context},
        )

    def publish_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        scenario = self._scenario(request, object_id)
        if not self._can_publish(request, scenario):
            raise PermissionDenied
        change_url = reverse("admin:scenarios_admin_scenario_change", args=[scenario.pk])
        form = PublishForm(request.POST or None)
        refused: ScenarioError | None = None
        if request.method == "POST" and form.is_valid():
            try:
                version = do_publish(scenario, user=request.user, note=form.cleaned_data["note"])
            except NothingToPublish as exc:
                self.message_user(request, exc.message, messages.WARNING)
                return HttpResponseRedirect(change_url)
            except ScenarioError as exc:
                refused = exc
            else:
                self.message_user(
                    request,
                    _(
                        "Published %(slug)s version %(n)s. New sessions use it now; sessions "
                        "already running keep the version they started with."
                    )
                    % {"slug": scenario.slug, "n": version.number},
                    messages.SUCCESS,
                )
                return HttpResponseRedirect(change_url)
        definition, issues = assemble(scenario)
        failures = [] if issues else run_publish_checks(definition)
        latest = scenario.latest_version()
        diff = (
            []
            if issues
            else diff_against_latest(
                latest, "draft", latest_yaml(latest), dump_definition(definition)
            )
        )
        return self._page(
            request,
            "publish.html",
            title=_("Publish %(slug)s") % {"slug": scenario.slug},
            original=scenario,
            form=form,
            refused=refused,
            issues=[str(i) for i in issues],
            failures=failures,
            latest=latest,
            diff=diff,
            unchanged=not issues and latest is not None and not any(diff),
            cases=len(definition.get("examples", [])),
        )

    def diff_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        scenario = self._scenario(request, object_id)
        if not self.has_view_permission(request, scenario):
            raise PermissionDenied
        numbers = list(scenario.versions.order_by("number").values_list("number", flat=True))
        choices = [str(n) for n in numbers] + ["draft"]
        _latest, changed = draft_status(scenario)
        default_b = "draft" if changed or not numbers else str(numbers[-1])
        default_a = (
            str(numbers[-1])
            if changed and numbers
            else (str(numbers[-2]) if len(numbers) > 1 else choices[0])
        )
        a = request.GET.get("a", default_a)
        b = request.GET.get("b", default_b)
        if a not in choices or b not in choices:
            raise Http404("No such version.")
        texts = {}
        problems: list[str] = []
        for side in (a, b):
            try:
                texts[side] = (
                    export_text(scenario, None, draft=True)
                    if side == "draft"
                    else (export_text(scenario, int(side)))
                )
            except ScenarioError as exc:
                texts[side] = ""
                problems = exc.problems
        return self._page(
            request,
            "diff.html",
            title=_("Compare versions of %(slug)s") % {"slug": scenario.slug},
            original=scenario,
            choices=choices,
            a=a,
            b=b,
            problems=problems,
            diff=diff_lines(side_label(a), side_label(b), texts[a], texts[b]),
        )

    def export_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        scenario = self._scenario(request, object_id)
        if not self.has_view_permission(request, scenario):
            raise PermissionDenied
        version = request.GET.get("version")
        try:
            text = export_text(
                scenario,
                int(version) if version and version.isdigit() else None,
                draft="draft" in request.GET,
            )
        except ScenarioError as exc:
            self.message_user(request, exc.message, messages.ERROR)
            return HttpResponseRedirect(
                reverse("admin:scenarios_admin_scenario_change", args=[scenario.pk])
            )
        audit(
            "scenario.exported",
            obj=scenario,
            actor=request.user,
            detail={"version": version or "", "draft": "draft" in request.GET},
        )
        return yaml_response({f"{scenario.slug}.yaml": text})

    @admin.action(
        description=gettext_lazy("Export selected scenarios as YAML"), permissions=["view"]
    )
    def export_yaml(self, request: HttpRequest, queryset: QuerySet[Scenario]) -> HttpResponse:
        files = {}
        for scenario in queryset.order_by("slug"):
            # The newest published version; a never-published scenario exports its draft.
            draft = scenario.latest_version() is None
            try:
                files[f"{scenario.slug}.yaml"] = export_text(scenario, draft=draft)
            except ScenarioError as exc:
                self.message_user(request, f"{scenario.slug}: {exc.message}", messages.ERROR)
                return HttpResponseRedirect(request.get_full_path())
        for scenario in queryset:
            audit("scenario.exported", obj=scenario, actor=request.user, detail={"bulk": True})
        return yaml_response(files)

    def schema_view(self, request: HttpRequest) -> HttpResponse:
        """The JSON Schema of a definition, for editors that check a scenario file as it
        is typed (the import page says how to point one at it)."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        kind = request.GET.get("kind")
        if kind:
            # One kind's model alone (what the YAML editor of that kind links to).
            try:
                model = pack_for(kind).definition_model
            except UnknownDomain:
                model = None
            if model is None:
                raise Http404("No such kind.")
            schema = model.model_json_schema()
        else:
            schema = definition_json_schema()
        return JsonResponse(schema, content_type="application/schema+json")

    def import_view(self, request: HttpRequest) -> HttpResponse:
        if not (self.has_add_permission(request) and self.has_change_permission(request)):
            raise PermissionDenied
        form = ImportForm(request.POST or None, request.FILES or None)
        refused: ScenarioError | None = None
        if request.method == "POST" and form.is_valid():
            upload = form.cleaned_data["file"]
            publish = form.cleaned_data["publish"]
            if publish and not request.user.has_perm("scenarios_admin.add_scenarioversion"):
                raise PermissionDenied
            try:
                text = upload.read().decode("utf-8")
            except UnicodeDecodeError:
                refused = ScenarioError(_("The file is not UTF-8 text. Nothing was changed."))
            else:
                try:
                    result = do_import(
                        text,
                        source=upload.name,
                        user=request.user,
                        publish=publish,
                        note=form.cleaned_data["note"],
                    )
                except ScenarioError as exc:
                    refused = exc
                else:
                    what = {
                        "slug": result.scenario.slug,
                        "verb": _("created") if result.created else _("replaced"),
                    }
                    if result.version is not None:
                        done = _("Imported %(slug)s: draft %(verb)s, published version %(n)s.") % {
                            **what,
                            "n": result.version.number,
                        }
                    elif result.unchanged:
                        done = (
                            _(
                                "Imported %(slug)s: draft %(verb)s, unchanged from the newest "
                                "version."
                            )
                            % what
                        )
                    else:
                        done = _("Imported %(slug)s: draft %(verb)s.") % what
                    self.message_user(request, done, messages.SUCCESS)
                    return HttpResponseRedirect(
                        reverse("admin:scenarios_admin_scenario_change", args=[result.scenario.pk])
                    )
        schema_url = request.build_absolute_uri(reverse("admin:scenarios_admin_scenario_schema"))
        return self._page(
            request,
            "import.html",
            title=_("Import a scenario"),
            form=form,
            refused=refused,
            schema_url=schema_url,
        )


def _as_yaml(obj: Any) -> bool:
    return isinstance(obj, Scenario) and edited_as_yaml(obj.kind)


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
