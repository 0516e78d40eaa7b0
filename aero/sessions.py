"""Sessions that end after a time without use (AERO_SESSION_IDLE_MINUTES).

Django's sessions expire SESSION_COOKIE_AGE after their last save. Saving on every
request (SESSION_SAVE_EVERY_REQUEST) would make every page one write heavier; instead a
used session is saved again when its last renewal is at least RENEW_AFTER_SECONDS old,
so the idle clock is exact to that minute at the cost of one write a minute."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from importlib import import_module
from typing import Any

from django.conf import settings
from django.contrib import auth
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.signals import user_logged_in
from django.core.exceptions import ValidationError
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.utils.crypto import constant_time_compare

RENEWED_KEY = "_aero_renewed"
RENEW_AFTER_SECONDS = 60
CLEAR_EVERY_SECONDS = 3600
_last_clear: float | None = None


class IdleSessionMiddleware:
    """Renews (saves) a session this request used, at most once a minute. Inside
    SessionMiddleware, which saves a modified session with a fresh expiry."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        session = getattr(request, "session", None)
        # Only a session this request loaded (signed in): never a query of its own.
        if session is not None and hasattr(session, "_session_cache") and session.session_key:
            now = int(time.time())
            if now - int(session.get(RENEWED_KEY, 0)) >= RENEW_AFTER_SECONDS:
                session[RENEWED_KEY] = now
        return response


@receiver(user_logged_in, dispatch_uid="aero-session-renewed-at-login")
def renewed_at_login(sender: Any, request: HttpRequest | None, **kwargs: Any) -> None:
    # Signing in saves the session anyway: the first minute needs no second write.
    if request is not None and hasattr(request, "session"):
        request.session[RENEWED_KEY] = int(time.time())
        # The idle expiry, not the short one of a signed-out draft (aero.drafts).
        request.session.set_expiry(None)


def clear_expired_sessions() -> bool:
    """Delete the rows of expired sessions (ended sign-ins, and the anonymous sessions
    that hold a signed-out operator's draft: aero.drafts), at most once an hour per
    process. Django leaves this to `manage.py clearsessions`, which nothing ran: the
    table only grew. Returns whether it ran now (a periodic task, diagnosis.maintenance)."""
    global _last_clear
    now = time.monotonic()
    if _last_clear is not None and now - _last_clear < CLEAR_EVERY_SECONDS:
        return False
    _last_clear = now
    import_module(settings.SESSION_ENGINE).SessionStore.clear_expired()
    return True


Viewer = tuple[Any, str | None]  # (user id, the key of the sign-in session it came with)


def _session_data(keys: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The data of each session that exists and has not expired. Database-backed
    engines: one query for all of them; cache or cookie sessions: one read each."""
    store = import_module(settings.SESSION_ENGINE).SessionStore
    data: dict[str, dict[str, Any]] = {}
    # Only what could be a key (Django's are 32 letters and digits): a cookie is anyone's
    # to write, and one that PostgreSQL refuses (a NUL) would fail everyone's read.
    keys = {key for key in keys if key.isascii() and key.isalnum() and len(key) <= 40}
    if hasattr(store, "get_model_class"):
        rows = (
            store.get_model_class()
            .objects.filter(session_key__in=keys, expire_date__gt=timezone.now())
            .values_list("session_key", "session_data")
        )
        data = {key: store().decode(raw) for key, raw in rows}
    else:
        for key in keys:
            session = store(key)
            loaded = session.load()
            if session.session_key == key:
                data[key] = loaded
    return data


def _hash_holds(session: dict[str, Any], user: Any) -> bool:
    """The session's password hash is the user's (under the current key or a fallback
    one, as django.contrib.auth.get_user accepts): a password change ends sign-ins."""
    stored = str(session.get(auth.HASH_SESSION_KEY, ""))
    hashes = [user.get_session_auth_hash()] + [
        user._get_session_auth_hash(secret=old) for old in settings.SECRET_KEY_FALLBACKS
    ]
    return any(constant_time_compare(stored, expected) for expected in hashes)


def signed_in(viewers: Iterable[Viewer]) -> set[Viewer]:
    """The viewers whose sign-in still stands: their session exists, has not expired and
    still holds that user with the user's current password hash (a sign-out flushes it,
    a password change invalidates it). Live sockets ask at every push: a socket outlives
    the sign-in it was opened with. Database-backed session engines: one query for the
    sessions and one for the users' hashes."""
    wanted = [(user_id, key) for user_id, key in viewers if user_id is not None and key]
    if not wanted:
        return set()
    data = _session_data(key for _, key in wanted)
    passwords = dict(
        get_user_model()
        .objects.filter(pk__in={user_id for user_id, _ in wanted}, is_active=True)
        .values_list("pk", "password")
    )
    found: set[Viewer] = set()
    for user_id, key in wanted:
        session = data.get(str(key), {})
        if user_id not in passwords or str(session.get(auth.SESSION_KEY)) != str(user_id):
            continue
        if _hash_holds(session, get_user_model()(pk=user_id, password=passwords[user_id])):
            found.add((user_id, key))
    return found


def users_signed_in(keys: Iterable[str]) -> dict[str, Any]:
    """The user each sign-in session key stands for, as django.contrib.auth.get_user
    finds it (session not expired, its backend still configured, the user able to sign
    in, the password hash unchanged); keys of no sign-in are left out. For many sockets
    opening at once: one query for the sessions and one for the users, where get_user
    costs two per key (users of a backend other than ModelBackend are read one by one).
    Unlike get_user it never rewrites a session (a socket cannot set a cookie)."""
    data = _session_data(keys)
    model = get_user_model()
    wanted: dict[str, tuple[Any, Any]] = {}  # key -> (user id, backend)
    for key, session in data.items():
        backend_path = session.get(auth.BACKEND_SESSION_KEY)
        if auth.SESSION_KEY not in session or backend_path not in settings.AUTHENTICATION_BACKENDS:
            continue
        try:
            user_id = model._meta.pk.to_python(session[auth.SESSION_KEY])
        except ValidationError:
            continue
        wanted[key] = (user_id, auth.load_backend(backend_path))
    by_model = {
        user_id for user_id, backend in wanted.values() if isinstance(backend, ModelBackend)
    }
    users = {user.pk: user for user in model._default_manager.filter(pk__in=by_model)}
    found: dict[str, Any] = {}
    for key, (user_id, backend) in wanted.items():
        if isinstance(backend, ModelBackend):
            user = users.get(user_id)
            user = user if user is not None and backend.user_can_authenticate(user) else None
        else:  # a backend without get_user (axes' own) signs no one in
            get_user = getattr(backend, "get_user", None)
            user = get_user(user_id) if get_user is not None else None
        if user is not None and _hash_holds(data[key], user):
            found[key] = user
    return found
