"""What an operator typed is never lost to a refusal they did not cause.

A form posted by someone whose sign-in ran out (AERO_SESSION_IDLE_MINUTES) is not run:
its text is kept in the (anonymous) session under the form's address, the sign-in page
says why it came, and once signed in (Django keeps the session's data when it renews
its key) the page the form lives on shows the text again, unsent, for the operator to
check and send. A refused update (too long, say) is kept the same way. An HTMX post
gets a 401 instead of the sign-in page in its target (aero.js says what happened and
leaves the form as it was); an HTMX GET takes the whole page to sign in and back."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext as _
from django_htmx.http import HttpResponseClientRedirect

from aero.text import MAX_MESSAGE

DRAFT_KEY = "aero_draft"
# A draft is what the forms take (MAX_MESSAGE characters at most), with room for a text
# refused as too long; more or longer fields are cut, whoever posts them.
MAX_FIELD = 4 * MAX_MESSAGE
MAX_FIELDS = 8
# Signed out, anyone can post: one draft per client (its session), no larger than one
# form's text, kept for half an hour (expired rows go hourly:
# aero.sessions.clear_expired_sessions), and such posts are rate-limited by address
# (aero.ratelimit), so a flood of them cannot grow the session table without bound.
ANONYMOUS_MAX_FIELDS = 3
ANONYMOUS_DRAFT_SECONDS = 30 * 60


def keep_draft(request: HttpRequest, action: str, data: Any) -> None:
    """Keep the posted text fields for the form that posts to `action`."""
    fields = [(k, v) for k, v in data.items() if k != "csrfmiddlewaretoken" and isinstance(v, str)]
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        kept = {key: value[:MAX_FIELD] for key, value in fields[:MAX_FIELDS]}
    else:
        kept = {key: value[:MAX_MESSAGE] for key, value in fields[:ANONYMOUS_MAX_FIELDS]}
        # A sign-in puts the idle expiry back (aero.sessions).
        request.session.set_expiry(ANONYMOUS_DRAFT_SECONDS)
    request.session[DRAFT_KEY] = {"action": action, "data": kept}


def take_draft(request: HttpRequest, action: str) -> dict[str, str] | None:
    """The text kept for the form that posts to `action`, once (then it is gone)."""
    session = getattr(request, "session", None)
    if session is None or DRAFT_KEY not in session:
        return None
    draft = session[DRAFT_KEY]
    if not isinstance(draft, dict) or draft.get("action") != action:
        return None
    del session[DRAFT_KEY]
    data = draft.get("data")
    return data if isinstance(data, dict) else None


def signed_out(request: HttpRequest) -> HttpResponseBase:
    """The answer to a request whose sign-in ran out: a page to sign in again, with what
    it posted kept for the page it came from."""
    if request.method != "POST":
        if request.headers.get("HX-Request") == "true":
            # A link, a filter or a poll run by htmx: the whole page goes to sign in and
            # comes back to the page it was on (HX-Current-URL), never the sign-in page
            # swapped into a panel of it. (A GET carries no typed text to keep.)
            login = redirect_to_login(_current_page(request))
            return HttpResponseClientRedirect(login["Location"])
        return redirect_to_login(request.get_full_path())
    keep_draft(request, request.path, request.POST)
    if request.headers.get("HX-Request") == "true":
        # Not the sign-in page inside the form's target: htmx swaps no 401 and aero.js
        # tells the operator, whose text stays in the form.
        return HttpResponse(status=401, headers={"HX-Reswap": "none"})
    messages.warning(
        request,
        _(
            "You were signed out before this was sent: nothing was saved. "
            "Sign in again, and the page shows your text to check and send."
        ),
    )
    return redirect_to_login(_form_page(request))


def _current_page(request: HttpRequest) -> str:
    """The page an htmx request was made from, when it is this site's."""
    return _same_site_path(request, request.headers.get("HX-Current-URL", ""))


def _form_page(request: HttpRequest) -> str:
    """The page the form was on (the Referer, when it is this site's: browsers send it
    on a form's post here), else the address posted to."""
    return _same_site_path(request, request.headers.get("Referer", ""))


def _same_site_path(request: HttpRequest, url: str) -> str:
    """The path and query of a URL of this site, else the address requested."""
    if url and url_has_allowed_host_and_scheme(
        url, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        parts = urlsplit(url)
        return parts.path + (f"?{parts.query}" if parts.query else "") or "/"
    return request.get_full_path()
