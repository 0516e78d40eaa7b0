"""Published scenario versions in the admin: immutable, listed on their scenario,
compared as YAML and downloaded."""

from __future__ import annotations

import difflib
import io
import zipfile
from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.translation import gettext_lazy

from aero.admin_base import ReadOnlyAdmin
from scenarios_admin.models import Scenario, ScenarioVersion
from scenarios_admin.yamlio import dump_definition


class ScenarioVersionInline(admin.TabularInline[ScenarioVersion, Scenario]):
    model = ScenarioVersion
    classes = ["collapse"]
    fields = ("number", "published_at", "published_by", "note", "links")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True
    verbose_name_plural = gettext_lazy(
        "Published versions (immutable; sessions pin the one they start with)"
    )

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="")
    def links(self, obj: ScenarioVersion) -> str:
        return version_links(obj)


def version_links(version: ScenarioVersion) -> str:
    diff = reverse("admin:scenarios_admin_scenario_diff", args=[version.scenario_id])
    export = reverse("admin:scenarios_admin_scenario_export", args=[version.scenario_id])
    if version.number > 1:
        return format_html(
            '<a href="{}?a={}&amp;b={}">changes since v{}</a> · <a href="{}?version={}">YAML</a>',
            diff,
            version.number - 1,
            version.number,
            version.number - 1,
            export,
            version.number,
        )
    return format_html('<a href="{}?version={}">YAML</a>', export, version.number)


def latest_yaml(version: ScenarioVersion | None) -> str:
    return dump_definition(version.definition) if version is not None else ""


def side_label(side: str) -> str:
    return "draft" if side == "draft" else f"v{side}"


def diff_against_latest(
    latest: ScenarioVersion | None, side: str, before: str, after: str
) -> list[dict[str, str]]:
    return diff_lines(f"v{latest.number}" if latest else "(nothing published)", side, before, after)


def diff_lines(a: str, b: str, before: str, after: str) -> list[dict[str, str]]:
    lines = difflib.unified_diff(
        before.splitlines(), after.splitlines(), fromfile=a, tofile=b, lineterm="", n=3
    )
    kinds = {"+": "added", "-": "removed", "@": "hunk"}
    return [
        {
            "text": line,
            "kind": "file" if line.startswith(("+++", "---")) else kinds.get(line[:1], ""),
        }
        for line in lines
    ]


def yaml_response(files: dict[str, str]) -> HttpResponse:
    """One scenario: its .yaml file; several: a zip with one file per scenario."""
    if len(files) == 1:
        ((name, text),) = files.items()
        response = HttpResponse(text, content_type="application/yaml; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="{name}"'
        return response
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    response = HttpResponse(buffer.getvalue(), content_type="application/zip")
    response["Content-Disposition"] = 'attachment; filename="scenarios.zip"'
    return response


@admin.register(ScenarioVersion)
class ScenarioVersionAdmin(ReadOnlyAdmin):
    """Published versions are immutable: shown, never edited."""

    list_display = ["scenario", "number", "published_at", "published_by", "note"]
    list_filter = ["scenario"]
    readonly_fields = [
        "scenario",
        "number",
        "published_at",
        "published_by",
        "note",
        "checksum",
        "links",
        "as_yaml",
    ]
    exclude = ["definition"]

    @admin.display(description=gettext_lazy("Compare and download"))
    def links(self, obj: ScenarioVersion) -> str:
        return version_links(obj)

    @admin.display(description=gettext_lazy("Definition (YAML)"))
    def as_yaml(self, obj: ScenarioVersion) -> str:
        return format_html("<pre>{}</pre>", dump_definition(obj.definition))
