"""The open approval count in every page's nav and tab title, for those who decide."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

from django.http import HttpRequest

from aero.roles import DECIDE_APPROVALS, has_role
from approvals.models import Approval


def pending_context(request: HttpRequest) -> dict[str, Callable[[], int] | None]:
    """A callable, counted once and only when a template shows it (the nav and the title
    both do, on full pages; partials and JSON never pay the query)."""
    if not has_role(getattr(request, "user", None), DECIDE_APPROVALS):
        return {"pending_count": None}

    @cache
    def count() -> int:
        return open_approval_count()

    return {"pending_count": count}


def open_approval_count() -> int:
    # The same rows the queue lists: a deleted session's approvals never count.
    return Approval.objects.open().filter(session__deleted_at__isnull=True).count()
