"""Django's database sessions, read by a statement compiled once per connection: every
signed-in request reads its session, and building the queryset cost more CPU than
running it (issue 37: the approval queue's cached page is mostly this fixed cost)."""

from __future__ import annotations

import logging
from typing import Any

from django.contrib.sessions.backends.db import SessionStore as DatabaseStore
from django.contrib.sessions.models import Session
from django.core.exceptions import SuspiciousOperation
from django.utils import timezone

from aero.compiled import Arg, Compiled

_field = Session._meta.get_field
_LOAD = Compiled(
    Session,
    lambda: Session.objects.filter(
        session_key=Arg(0, _field("session_key")), expire_date__gt=Arg(1, _field("expire_date"))
    ),
)


class SessionStore(DatabaseStore):
    def _get_session_from_db(self) -> Any:
        # As Django's own, with the compiled read.
        try:
            return _LOAD.get(self.session_key, timezone.now())
        except (Session.DoesNotExist, SuspiciousOperation) as exc:
            if isinstance(exc, SuspiciousOperation):
                logging.getLogger(f"django.security.{exc.__class__.__name__}").warning(str(exc))
            self._session_key = None
            return None
