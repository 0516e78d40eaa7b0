"""MCP servers in the admin: listed and edited with their secret environment write-only,
tested ("test / discover tools": started with N tools, or why not), and shown with the
tools they listed and their schemas. Edits are audited through the admin's log
(aero.audit_trail), the switch and the secrets by their own entries."""

from __future__ import annotations

import json
import re
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Count, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from tools.models import ENV_NAME, McpServer, McpTool, Skill, SkillVersion
from tools.probe import probe_server
from tools.skills import MAX_ZIP_BYTES, SkillRejected, activate_version, save_upload

OUTCOMES = {
    "started": gettext_lazy("started"),
    "not_found": gettext_lazy("command not found"),
    "crashed": gettext_lazy("crashed"),
    "timed_out": gettext_lazy("timed out"),
    "lying": gettext_lazy("answered outside its schema or the protocol"),
    "refused": gettext_lazy("refused"),
    "tool_error": gettext_lazy("a tool answered an error"),
}


def parse_env_lines(text: str) -> dict[str, str]:
    """`NAME=value` per line (blank lines skipped); a clear error naming the line."""
    found: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        name, sep, value = line.partition("=")
        name = name.strip()
        if not sep or not re.match(ENV_NAME, name):
            raise ValidationError(
                _("Line %(n)s is not NAME=value (a name of letters, digits and _).") % {"n": number}
            )
        found[name] = value.rstrip("\r")
    return found


class McpServerForm(forms.ModelForm[McpServer]):
    # Write-only: stored values are never rendered back; leave empty to keep them.
    secret_env = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "autocomplete": "off"}),
        help_text=gettext_lazy(
            "Write only: NAME=value per line, stored encrypted and never shown again. "
            "Leave empty to keep the stored ones; NAME= removes one."
        ),
    )
    clear_secret_env = forms.BooleanField(
        required=False, help_text=gettext_lazy("Remove every stored secret variable.")
    )

    class Meta:
        model = McpServer
        fields = [
            "name",
            "description",
            "command",
            "args",
            "env",
            "allowed_tools",
            "call_timeout_seconds",
            "memory_mb",
            "cpu_seconds",
            "enabled",
        ]
        help_texts = {
            "args": gettext_lazy(
                'A JSON list of texts, e.g. ["-m", "mcp_server_git", "--repository", "{repo}"]; '
                "{repo} is filled with the session's repository by the code tool."
            ),
            "env": gettext_lazy('A JSON object of names to texts, e.g. {"LOG_LEVEL": "info"}.'),
            "allowed_tools": gettext_lazy(
                'A JSON list of tool names, e.g. ["git_show", "git_log"]; empty: every tool '
                "the server lists."
            ),
        }

    def clean_secret_env(self) -> dict[str, str]:
        return parse_env_lines(self.cleaned_data.get("secret_env") or "")

    def save(self, commit: bool = True) -> McpServer:
        server = super().save(commit=False)
        server.update_secret_env(
            self.cleaned_data.get("secret_env") or {},
            clear=bool(self.cleaned_data.get("clear_secret_env")),
        )
        if commit:
            server.save()
        return server


class McpToolInline(admin.TabularInline[McpTool, McpServer]):
    model = McpTool
    extra = 0
    can_delete = False
    fields = ["name", "allowed_here", "description", "schemas", "discovered_at"]
    readonly_fields = ["name", "allowed_here", "description", "schemas", "discovered_at"]

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(boolean=True, description=gettext_lazy("Allowed"))
    def allowed_here(self, obj: McpTool) -> bool:
        return obj.allowed

    @admin.display(description=gettext_lazy("Input and output schemas"))
    def schemas(self, obj: McpTool) -> str:
        output = json.dumps(obj.output_schema, indent=1) if obj.output_schema else "—"
        return format_html(
            "<pre>{}</pre><pre>{}</pre>", json.dumps(obj.input_schema, indent=1), output
        )


@admin.register(McpServer)
class McpServerAdmin(admin.ModelAdmin[McpServer]):
    form = McpServerForm
    list_display = [
        "name",
        "command",
        "enabled",
        "tool_count",
        "secret_names_shown",
        "last_test",
    ]
    list_filter = ["enabled"]
    readonly_fields = ["secret_names_shown", "last_test"]
    inlines = [McpToolInline]
    actions = ["test_servers"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[McpServer]:
        return super().get_queryset(request).annotate(listed=Count("tools"))

    @admin.display(description=gettext_lazy("Tools listed"))
    def tool_count(self, obj: McpServer) -> int:
        return int(getattr(obj, "listed", 0))

    @admin.display(description=gettext_lazy("Secret variables"))
    def secret_names_shown(self, obj: McpServer) -> str:
        return ", ".join(obj.secret_names()) or "—"

    @admin.display(description=gettext_lazy("Last test"))
    def last_test(self, obj: McpServer) -> str:
        if obj.last_tested_at is None:
            return _("never tested")
        label = OUTCOMES.get(obj.last_test_outcome, obj.last_test_outcome)
        return f"{label}: {obj.last_test_message}"

    @admin.action(description=gettext_lazy("Test / discover tools"), permissions=["change"])
    def test_servers(self, request: HttpRequest, queryset: QuerySet[McpServer]) -> None:
        for server in queryset.order_by("name"):
            result = probe_server(server, request.user)
            label = OUTCOMES.get(result.outcome, result.outcome)
            self.message_user(
                request,
                f"{server.name}: {label}: {result.message}",
                messages.SUCCESS if result.ok else messages.ERROR,
            )


# --- skills -------------------------------------------------------------------------------


class SkillUploadForm(forms.Form):
    file = forms.FileField(
        label=gettext_lazy("Skill zip"),
        help_text=gettext_lazy(
            "A zip with skill.yaml at its top (name, version, description, arguments and "
            "result as JSON Schemas, entry, risk, applies_to) and the files it names."
        ),
    )
    activate = forms.BooleanField(
        required=False,
        label=gettext_lazy("Make it the active version"),
        help_text=gettext_lazy("A skill's first version is always active."),
    )


class SkillVersionInline(admin.TabularInline[SkillVersion, Skill]):
    model = SkillVersion
    extra = 0
    can_delete = False
    fields = ("version", "risk_class", "entry", "applies_to", "files_listed", "uploaded")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description=gettext_lazy("Files"))
    def files_listed(self, obj: SkillVersion) -> str:
        return ", ".join(f.path for f in obj.files.all())

    @admin.display(description=gettext_lazy("Uploaded"))
    def uploaded(self, obj: SkillVersion) -> str:
        who = obj.uploaded_by.get_username() if obj.uploaded_by else "—"
        return f"{obj.uploaded_at:%Y-%m-%d %H:%M} {who} sha256 {obj.sha256[:12]}"


class SkillForm(forms.ModelForm[Skill]):
    class Meta:
        model = Skill
        fields = ["active_version"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # only this skill's own versions may become its active one
        field = self.fields["active_version"]
        field.queryset = SkillVersion.objects.filter(skill=self.instance)  # type: ignore[attr-defined]


@admin.register(Skill)
class SkillAdmin(admin.ModelAdmin[Skill]):
    """Skills: added by uploading a zip (the add page is the upload form), their versions
    listed, the active one chosen. Uploads and activations are audited (skill.uploaded,
    skill.activated), other edits through the admin's log."""

    form = SkillForm
    list_display = ["name", "risk_class", "active_version", "version_count", "updated_at"]
    readonly_fields = ["name", "description", "risk_class"]
    fields = ["name", "description", "risk_class", "active_version"]
    inlines = [SkillVersionInline]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Skill]:
        return (
            super()
            .get_queryset(request)
            .select_related("active_version")
            .annotate(kept=Count("versions"))
        )

    @admin.display(description=gettext_lazy("Versions"))
    def version_count(self, obj: Skill) -> int:
        return int(getattr(obj, "kept", 0))

    def add_view(
        self, request: HttpRequest, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_add_permission(request):
            raise PermissionDenied
        form = SkillUploadForm(request.POST or None, request.FILES or None)
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data["file"].read(MAX_ZIP_BYTES + 1)
            try:
                version = save_upload(data, request.user, activate=form.cleaned_data["activate"])
            except SkillRejected as exc:
                form.add_error("file", f"{exc.message} ({exc.code}). " + _("Nothing was kept."))
            else:
                self.message_user(
                    request,
                    _("Uploaded %(name)s version %(version)s.")
                    % {"name": version.skill.name, "version": version.version},
                    messages.SUCCESS,
                )
                return HttpResponseRedirect(
                    reverse("admin:tools_skill_change", args=[version.skill_id])
                )
        return TemplateResponse(
            request,
            "admin/tools/skill/upload.html",
            {
                **self.admin_site.each_context(request),
                "opts": self.opts,
                "form": form,
                "title": _("Upload a skill"),
            },
        )

    def save_model(self, request: HttpRequest, obj: Skill, form: Any, change: bool) -> None:
        chosen = form.cleaned_data.get("active_version")
        if chosen is not None:
            with transaction.atomic():
                activate_version(chosen, request.user)  # audited as skill.activated
            obj.refresh_from_db()
        else:
            super().save_model(request, obj, form, change)
