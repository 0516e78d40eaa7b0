"""The project's template engine: Django's, with every rendered template's output passed
through aero.text.neutralise_bidi. User and model text reaches pages in many ways (fields,
messages, titles, reports, live fragments, the admin); escaping keeps it from becoming
markup, this keeps it from reordering what surrounds it (U+202E turns "gnp.exe" into
"exe.png"). Done on the output, once, so no template or variable can miss it."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from django.template import TemplateDoesNotExist
from django.template.backends.django import DjangoTemplates, reraise
from django.template.backends.django import Template as DjangoTemplate
from django.utils.safestring import SafeString, mark_safe

from aero.text import neutralise_bidi


class Template(DjangoTemplate):
    def render(
        self, context: dict[str, Any] | None = None, request: HttpRequest | None = None
    ) -> SafeString:
        # Code points are plain ASCII: the output stays as safe as it was rendered.
        return mark_safe(neutralise_bidi(super().render(context, request)))


class Templates(DjangoTemplates):
    def from_string(self, template_code: str) -> Template:
        return Template(self.engine.from_string(template_code), self)

    def get_template(self, template_name: str) -> Template:
        try:
            return Template(self.engine.get_template(template_name), self)
        except TemplateDoesNotExist as exc:
            reraise(exc, self)
