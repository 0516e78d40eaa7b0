"""The interface language: zh-hans for these users unless they chose otherwise.

Order of choice for a request: the language kept in the signed-in session (taken from
the user's stored preference at sign-in, changed by the switch), then the language
cookie (a choice made before signing in, or by a previous user of this browser), then
LANGUAGE_CODE. The browser's Accept-Language is deliberately not consulted: operations
workstations often run an English system for Chinese staff (docs/i18n.md).
Reading the session costs nothing extra: AuthenticationMiddleware has loaded it already
for a signed-in user, and an anonymous request without a session cookie queries nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib.auth.signals import user_logged_in
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import redirect
from django.utils import translation
from django.utils.cache import patch_vary_headers
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

SESSION_KEY = "_aero_language"

# BCP 47 spelling for <html lang> (Django's codes are lower case: zh-hans).
HTML_LANG = {"zh-hans": "zh-Hans", "en": "en"}


# A scenario's language (its texts are zh and en) as the interface's language code.
SCENARIO_TO_INTERFACE = {"zh": "zh-hans", "en": "en"}


def interface_language(scenario_language: str) -> str:
    """The interface language for a scenario language ("zh" -> "zh-hans"): Django has no
    catalogue for a bare "zh", and a translation activated under it fell back to English."""
    return SCENARIO_TO_INTERFACE.get(scenario_language, scenario_language)


def supported(code: str | None) -> str | None:
    """`code` when it is one of LANGUAGES, else None (never trust a cookie or a form)."""
    if code and code in dict(settings.LANGUAGES):
        return code
    return None


# Machine interfaces answer in one language whoever calls them (scripts match on it;
# the API's documents and errors are English): the JSON API, alert ingest, /metrics.
MACHINE_PREFIXES = ("/api/v1/", "/ingest/", "/metrics")
MACHINE_LANGUAGE = "en"


def request_language(request: HttpRequest) -> str:
    if request.path.startswith(MACHINE_PREFIXES):
        return MACHINE_LANGUAGE
    session = getattr(request, "session", None)
    chosen = None
    if session is not None and (session.session_key or hasattr(session, "_session_cache")):
        chosen = supported(session.get(SESSION_KEY))
    return (
        chosen
        or supported(request.COOKIES.get(settings.LANGUAGE_COOKIE_NAME))
        or settings.LANGUAGE_CODE
    )


class UserLanguageMiddleware:
    """Activates the chosen language for the request (after AuthenticationMiddleware)
    and keeps the cookie in step with the session, so the choice outlives signing out."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        language = request_language(request)
        translation.activate(language)
        request.LANGUAGE_CODE = translation.get_language()
        response = self.get_response(request)
        patch_vary_headers(response, ("Cookie",))
        response.headers.setdefault("Content-Language", language)
        # A missing cookie means the default; a stale one (another user's) is corrected.
        # Never from a machine path: its fixed language is nobody's choice.
        cookie = request.COOKIES.get(settings.LANGUAGE_COOKIE_NAME, settings.LANGUAGE_CODE)
        if cookie != language and not request.path.startswith(MACHINE_PREFIXES):
            set_language_cookie(response, language)
        return response


def set_language_cookie(response: HttpResponse, language: str) -> None:
    response.set_cookie(
        settings.LANGUAGE_COOKIE_NAME,
        language,
        max_age=settings.LANGUAGE_COOKIE_AGE,
        path=settings.LANGUAGE_COOKIE_PATH,
        domain=settings.LANGUAGE_COOKIE_DOMAIN,
        secure=settings.LANGUAGE_COOKIE_SECURE,
        httponly=settings.LANGUAGE_COOKIE_HTTPONLY,
        samesite=settings.LANGUAGE_COOKIE_SAMESITE,  # type: ignore[arg-type]
    )


@require_POST
def set_language(request: HttpRequest) -> HttpResponse:
    """The language switch (a form in the header and on the sign-in page). Unlike
    Django's set_language it refuses an unknown language with a 400 instead of
    ignoring it, and stores a signed-in user's choice on their preference."""
    from aero.models import UserPreference

    language = supported(request.POST.get("language"))
    if language is None:
        return HttpResponseBadRequest(_("Unknown language."), content_type="text/plain")
    next_url = request.POST.get("next") or "/"
    if not url_has_allowed_host_and_scheme(
        next_url, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        next_url = "/"
    if request.user.is_authenticated:
        UserPreference.objects.update_or_create(user=request.user, defaults={"language": language})
        request.session[SESSION_KEY] = language
    translation.activate(language)
    response = redirect(next_url)
    set_language_cookie(response, language)
    return response


NOTIFY_SESSION_KEY = "aero_notify_risky"


def apply_at_login(sender: Any, request: HttpRequest | None, user: Any, **kwargs: Any) -> None:
    """At sign-in the user's stored language wins; without one, the language picked on
    the sign-in page (the cookie) becomes their stored preference."""
    from aero.models import UserPreference

    if request is None or not hasattr(request, "session"):
        return
    row = UserPreference.objects.filter(user=user).values_list("language", "notify_risky").first()
    # The approver's notification choice rides in the session too: no query per page.
    request.session[NOTIFY_SESSION_KEY] = bool(row and row[1])
    stored = supported(row[0] if row else None)
    if stored is None:
        picked = supported(request.COOKIES.get(settings.LANGUAGE_COOKIE_NAME))
        if picked is None:
            return
        UserPreference.objects.update_or_create(user=user, defaults={"language": picked})
        stored = picked
    request.session[SESSION_KEY] = stored
    translation.activate(stored)


def connect() -> None:
    user_logged_in.connect(apply_at_login, dispatch_uid="aero-language-at-login")


def i18n_context(request: HttpRequest) -> dict[str, Any]:
    code = translation.get_language() or settings.LANGUAGE_CODE
    return {
        "html_lang": HTML_LANG.get(code, code),
        "language_choices": [(c, HTML_LANG.get(c, c), n) for c, n in LANGUAGE_NAMES],
    }


# Each language named in itself, so a user who cannot read the current one finds theirs.
LANGUAGE_NAMES = (("zh-hans", "简体中文"), ("en", "English"))
