"""The model providers admin: keys are write-only, and a changed base URL clears the key."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from aero.models import audit
from aero.templatetags.aero_text import when
from scenarios_admin import breaker
from scenarios_admin.models import ProviderConfig, ProviderKind
from scenarios_admin.probe import probe


class ProviderConfigForm(forms.ModelForm[ProviderConfig]):
    # Write-only: the stored key is never rendered back; leave empty to keep it.
    api_key = forms.CharField(
        required=False,
        max_length=1000,
        widget=forms.PasswordInput(render_value=False),
        help_text=(
            gettext_lazy(
                "Write only. Leave empty to keep the current key. Changing the base URL clears "
                "the stored key: enter it again in the same save to use it with the new URL."
            )
        ),
    )
    clear_api_key = forms.BooleanField(
        required=False, help_text=gettext_lazy("Remove the stored key.")
    )
    key_cleared_by_url = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["base_url"].help_text = _(
            "Changing it clears the stored API key, so the key is never sent to a host it "
            "was not given for."
        )

    class Meta:
        model = ProviderConfig
        fields = [
            "name",
            "kind",
            "base_url",
            "model",
            "price_input_per_1k",
            "price_output_per_1k",
            "timeout_seconds",
            "retries",
            "priority",
            "enabled",
            "max_steps",
            "max_tokens",
            "max_cost",
        ]

    def clean(self) -> dict[str, Any]:
        """An OpenAI-compatible provider needs a URL and a model (a database constraint
        too): said on the field, where the constraint's own message named only itself.
        A field with an error is left out of the model's constraint check."""
        cleaned = super().clean() or {}
        if cleaned.get("kind") and cleaned["kind"] != ProviderKind.OFFLINE:
            if not cleaned.get("base_url") and "base_url" not in self.errors:
                self.add_error(
                    "base_url",
                    _(
                        "An OpenAI-compatible provider needs the base URL of its API "
                        "(e.g. https://api.example.com/v1); only the offline provider has none."
                    ),
                )
            if not cleaned.get("model") and "model" not in self.errors:
                self.add_error(
                    "model",
                    _("An OpenAI-compatible provider needs a model name (e.g. gpt-4o-mini)."),
                )
        return cleaned

    def clean_api_key(self) -> str:
        """A key travels in an HTTP header: one with a line break could add headers of its
        own, and one with other than printable ASCII cannot be sent at all ("Test
        connection" failed with a server error). Refused here, where it is typed."""
        key: str = self.cleaned_data.get("api_key") or ""
        if key and not (key.isascii() and key.isprintable()):
            raise ValidationError(
                _(
                    "An API key is printable ASCII (letters, digits, punctuation, spaces); this "
                    "one has line breaks or other characters an HTTP header cannot carry. "
                    "Nothing was saved: paste the key again."
                )
            )
        return key

    def save(self, commit: bool = True) -> ProviderConfig:
        config = super().save(commit=False)
        # A key entered with the new URL is for that URL; the old key never follows it.
        url_changed = bool(self.instance.pk) and "base_url" in self.changed_data
        if self.cleaned_data.get("api_key") and not self.cleaned_data.get("clear_api_key"):
            config.set_api_key(self.cleaned_data["api_key"])
        elif self.cleaned_data.get("clear_api_key") or url_changed:
            self.key_cleared_by_url = url_changed and bool(config.api_key_encrypted)
            config.set_api_key("")
        if commit:
            config.save()
        return config


@admin.register(ProviderConfig)
class ProviderConfigAdmin(admin.ModelAdmin[ProviderConfig]):
    form = ProviderConfigForm
    list_display = [
        "name",
        "kind",
        "model",
        "base_url",
        "priority",
        "enabled",
        "has_key",
        "breaker_state",
    ]
    list_filter = ["kind", "enabled"]
    readonly_fields = ["breaker_state"]
    actions = ["test_connection"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[ProviderConfig]:
        return super().get_queryset(request).select_related("health")

    @admin.display(description=gettext_lazy("Circuit breaker"))
    def breaker_state(self, obj: ProviderConfig) -> str:
        """The breaker as every process sees it now (scenarios_admin.breaker)."""
        if obj.pk is None:
            return "—"
        health = getattr(obj, "health", None)
        state = breaker.state_of(health)
        if health is None or state == breaker.CLOSED:
            failures = health.failures if health is not None else 0
            if failures:
                return _("closed (%(n)s failed attempts in a row)") % {"n": failures}
            return _("closed")
        error = f"{health.last_error_class}: {health.last_error}" if health.last_error else ""
        if state == breaker.OPEN:
            return _("open until %(until)s (%(error)s)") % {
                "until": when(health.open_until),
                "error": error,
            }
        return _("half-open: the next call is a probe (%(error)s)") % {"error": error}

    def save_model(
        self, request: HttpRequest, obj: ProviderConfig, form: Any, change: bool
    ) -> None:
        super().save_model(request, obj, form, change)
        if getattr(form, "key_cleared_by_url", False):
            self.message_user(
                request,
                _(
                    "%(name)s: the base URL changed, so the stored API key was cleared; "
                    "enter the key for the new URL."
                )
                % {"name": obj.name},
                messages.WARNING,
            )

    @admin.display(boolean=True, description=gettext_lazy("API key set"))
    def has_key(self, obj: ProviderConfig) -> bool:
        return bool(obj.api_key_encrypted)

    @admin.action(
        description=gettext_lazy("Test connection (one tiny chat completion)"),
        permissions=["change"],
    )
    def test_connection(self, request: HttpRequest, queryset: QuerySet[ProviderConfig]) -> None:
        for config in queryset.order_by("priority", "name"):
            result = probe(config)
            # A provider that answers is healthy: its breaker closes (as a probe's would).
            closed = bool(result.ok) and breaker.succeeded(config.pk, breaker.MANUAL_PROBE) != ""
            audit(
                "provider.tested",
                obj=config,
                actor=request.user,
                detail={"ok": result.ok, "message": result.message, "breaker_closed": closed},
            )
            level = messages.SUCCESS if result.ok else messages.ERROR
            outcome = "OK" if result.ok else "failed"
            message = f"{config.name}: {outcome}: {result.message}"
            if closed:
                message += " " + _("(its circuit breaker is closed again)")
            self.message_user(request, message, level)
