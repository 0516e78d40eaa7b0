"""The scenario admin's own pages: publish, compare versions, export, import and the
definition's JSON Schema (ScenarioAdmin takes them from ScenarioPages)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from aero.models import audit
from aero.packs import UnknownDomain, pack_for
from scenarios_admin.actions import (
    NothingToPublish,
    ScenarioError,
    do_import,
    do_publish,
    draft_status,
    export_text,
    run_publish_checks,
)
from scenarios_admin.admin_versions import (
    diff_against_latest,
    diff_lines,
    latest_yaml,
    side_label,
    yaml_response,
)
from scenarios_admin.draft import assemble
from scenarios_admin.models import Scenario
from scenarios_admin.schema import definition_json_schema
from scenarios_admin.yamlio import dump_definition


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


class ScenarioPages(admin.ModelAdmin[Scenario]):
    """The pages a scenario has besides its change form, and the bulk YAML export."""

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
