from __future__ import annotations

from django.http import HttpRequest
from django_htmx.middleware import HtmxDetails


class HtmxHttpRequest(HttpRequest):
    """A request as views see it with django-htmx's middleware installed."""

    htmx: HtmxDetails
