"""Django's database sessions, and who they sign in, held per process between changes.

Every signed-in request reads its session, its user and the user's roles: three
statements that were most of the approval queue's cached page (issue 37). Each process
keeps what it read for a session key under two change stamps (aero.stamps), read in
one round trip when the session loads: the session's own (moved when its row is saved
or deleted: a sign-out, a renewal, a language chosen) and SIGN_IN (moved when a user,
a group or a user's groups change). A kept entry is used only while both stamps are
unchanged and the session has not expired, so a sign-out, a deactivation or a role
taken away counts on the very next request, in every process. The stamps are read
before the rows, and a stamp moves at the write and again after its commit: what a
reader read meanwhile is kept under a value that no longer holds.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib import auth
from django.contrib.auth.middleware import AuthenticationMiddleware as DjangoAuthentication
from django.contrib.auth.models import Group
from django.contrib.sessions.backends.db import SessionStore as DatabaseStore
from django.contrib.sessions.models import Session
from django.core.exceptions import SuspiciousOperation
from django.db.models.signals import m2m_changed, post_delete, post_save
from django.http import HttpRequest
from django.utils import timezone
from django.utils.functional import SimpleLazyObject

from aero import stamps
from aero.compiled import Arg, Compiled
from aero.roles import user_roles

_field = Session._meta.get_field
_LOAD = Compiled(
    Session,
    lambda: Session.objects.filter(
        session_key=Arg(0, _field("session_key")), expire_date__gt=Arg(1, _field("expire_date"))
    ),
)
# Sessions held per process (a few hundred bytes each): the active sign-ins.
KEPT = 4096


@dataclass
class _Kept:
    stamps: list[str]
    expire_date: datetime
    data: dict[str, Any]
    # The signed-in user read for this session, roles read (user_roles), None until then.
    user: Any = None


_kept: OrderedDict[str, _Kept] = OrderedDict()
_lock = threading.Lock()


# Stamps a signed-in request is likely to read next, read in the sign-in's round trip:
# the approval queue's (approvals.page_cache), one round trip to Redis a cached page
# instead of two. Read before the view reads any row, as a stamp must be.
ALSO_READ = (stamps.QUEUE,)


def _stamps_of(session_key: str) -> list[str]:
    return stamps.read_many(stamps.SIGN_IN, stamps.session_stamp(session_key), *ALSO_READ)


def read_stamp(request: HttpRequest, name: str) -> str:
    """The stamp of `name` as this request's sign-in read it (ALSO_READ), else read now."""
    found = getattr(getattr(request, "session", None), "_aero_stamps", None)
    if found is not None and name in found:
        return str(found[name])
    return stamps.read(name)


class SessionStore(DatabaseStore):
    _aero_kept: _Kept | None = None

    def load(self) -> dict[str, Any]:
        key = self.session_key
        if key is None:
            return super().load()
        read = _stamps_of(key)
        self._aero_stamps = dict(zip(ALSO_READ, read[2:], strict=True))
        # The entry is kept under the sign-in's own two.
        read = read[:2]
        kept = _kept.get(key)
        if kept is not None and kept.stamps == read and kept.expire_date > timezone.now():
            self._aero_kept = kept
            # The request may change its copy (then saves it, which moves the stamp).
            return copy.deepcopy(kept.data)
        row = self._get_session_from_db()
        if row is None:
            return {}
        data = self.decode(row.session_data)
        kept = _Kept(read, row.expire_date, copy.deepcopy(data))
        with _lock:
            _kept[key] = kept
            while len(_kept) > KEPT:
                _kept.popitem(last=False)
        self._aero_kept = kept
        return data

    def _get_session_from_db(self) -> Any:
        # As Django's own, with the compiled read.
        try:
            return _LOAD.get(self.session_key, timezone.now())
        except (Session.DoesNotExist, SuspiciousOperation) as exc:
            if isinstance(exc, SuspiciousOperation):
                logging.getLogger(f"django.security.{exc.__class__.__name__}").warning(str(exc))
            self._session_key = None
            return None


def _user(request: HttpRequest) -> Any:
    """Django's get_user (the session's user, its password hash verified), with the
    user and their roles kept with the session's entry: a copy per request."""
    if hasattr(request, "_cached_user"):
        return request._cached_user
    session = request.session
    # Loads the session (and its entry) if nothing did yet.
    user_id = session.get(auth.SESSION_KEY)
    kept = getattr(session, "_aero_kept", None)
    if kept is not None and kept.user is not None and user_id is not None:
        user = copy.copy(kept.user)
    else:
        user = auth.get_user(request)
        if kept is not None and user.is_authenticated:
            user_roles(user)  # read now: the copies carry them
            kept.user = copy.copy(user)
    request._cached_user = user  # type: ignore[attr-defined]  # as Django's get_user
    return user


class AuthenticationMiddleware(DjangoAuthentication):
    """Django's, with the signed-in user held per process (above)."""

    def process_request(self, request: HttpRequest) -> None:
        super().process_request(request)
        request.user = SimpleLazyObject(lambda: _user(request))  # type: ignore[assignment]


def _move(name: str) -> None:
    # Now, so that this process's next read, even inside the writer's transaction (a
    # test's), misses; and again after the commit, so that what a reader read before
    # the commit and kept under the first new value is not used.
    stamps.touch_now(name)
    stamps.touch(name)


def _session_changed(sender: Any, instance: Session, **kwargs: Any) -> None:
    _move(stamps.session_stamp(instance.session_key))


def _sign_ins_changed(sender: Any, update_fields: Any = None, **kwargs: Any) -> None:
    if update_fields is not None and set(update_fields) <= {"last_login"}:
        return  # a sign-in: its session's stamp moves with its new row
    if kwargs.get("action", "post_").startswith("post_"):
        _move(stamps.SIGN_IN)


def connect() -> None:
    post_save.connect(_session_changed, sender=Session, dispatch_uid="aero-session-saved")
    post_delete.connect(_session_changed, sender=Session, dispatch_uid="aero-session-deleted")
    user_model = auth.get_user_model()
    for model in (user_model, Group):
        post_save.connect(_sign_ins_changed, sender=model, dispatch_uid=f"aero-sign-in-{model}")
        post_delete.connect(_sign_ins_changed, sender=model, dispatch_uid=f"aero-sign-out-{model}")
    m2m_changed.connect(
        _sign_ins_changed, sender=user_model.groups.through, dispatch_uid="aero-user-groups"
    )
