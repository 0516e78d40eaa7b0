"""Roles and access helpers. Roles are Django groups; a superuser holds every role."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar, cast

from django.contrib.auth.models import AnonymousUser, Group
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.utils.translation import gettext_lazy as _

from aero.compiled import Arg, Compiled
from aero.drafts import signed_out
from aero.packs import installed_packs

ADMIN = "admin"
OPERATOR = "operator"
APPROVER = "approver"
AUDITOR = "auditor"
ALL_ROLES = (ADMIN, OPERATOR, APPROVER, AUDITOR)
# What the interface calls each role (the groups keep the code names above).
ROLE_LABELS = {
    ADMIN: _("admin"),
    OPERATOR: _("operator"),
    APPROVER: _("approver"),
    AUDITOR: _("auditor"),
}

# Who may do what. Auditors are read-only everywhere.
VIEW_SESSIONS = (ADMIN, OPERATOR, APPROVER, AUDITOR)
RUN_SESSIONS = (ADMIN, OPERATOR)
DECIDE_APPROVALS = (ADMIN, APPROVER)
# Ask for a restriction in force (a closure) to be lifted.
LIFT_RESTRICTIONS = (ADMIN, OPERATOR)
READ_AUDIT_LOG = (ADMIN, AUDITOR)
DELETE_SESSIONS = (ADMIN,)
# Tool servers and model providers run commands and hold credentials: admins only.
MANAGE_TOOLS = (ADMIN,)
# Approvers see the to-dos their timed-out approvals became; operators and admins
# resolve them (RUN_SESSIONS).
VIEW_TODOS = (ADMIN, OPERATOR, APPROVER)

UserLike = Any  # AbstractBaseUser | AnonymousUser; kept loose for channels' scope["user"]

# Read by every signed-in page: compiled once per connection.
_ROLES_OF = Compiled(
    Group,
    lambda: Group.objects.filter(
        user=Arg(0, Group._meta.get_field("user").target_field), name__in=ALL_ROLES
    ).values_list("name", flat=True),
)


def user_roles(user: UserLike) -> frozenset[str]:
    if user is None or isinstance(user, AnonymousUser) or not user.is_authenticated:
        return frozenset()
    if not user.is_active:
        return frozenset()
    if user.is_superuser:
        return frozenset(ALL_ROLES)
    cached = getattr(user, "_aero_roles", None)
    if cached is None:
        cached = frozenset(_ROLES_OF.rows(user.pk))
        user._aero_roles = cached
    return cached


def has_role(user: UserLike, roles: tuple[str, ...]) -> bool:
    return bool(user_roles(user) & set(roles))


def ensure_role_groups() -> None:
    for name in ALL_ROLES:
        Group.objects.get_or_create(name=name)


View = TypeVar("View", bound=Callable[..., HttpResponseBase])


def role_required(roles: tuple[str, ...]) -> Callable[[View], View]:
    """Anonymous users go to the login page; a signed-in user without the role gets 403."""

    def decorator(view: View) -> View:
        @wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            if not request.user.is_authenticated:
                # What a signed-out operator posted is kept for after the sign-in.
                return signed_out(request)
            if not has_role(request.user, roles):
                raise PermissionDenied(_("Your role does not allow this."))
            return view(request, *args, **kwargs)

        return cast(View, wrapped)

    return decorator


def roles_context(request: HttpRequest) -> dict[str, Any]:
    roles = user_roles(getattr(request, "user", None))
    return {
        "user_roles": sorted(roles),
        "can_run": bool(roles & set(RUN_SESSIONS)),
        "can_decide": bool(roles & set(DECIDE_APPROVALS)),
        "can_lift_restrictions": bool(roles & set(LIFT_RESTRICTIONS)),
        "can_read_audit": bool(roles & set(READ_AUDIT_LOG)),
        "can_view_history": bool(roles & set(VIEW_SESSIONS)),
        "can_view_todos": bool(roles & set(VIEW_TODOS)),
        # The installed packs' own pages, for the top bar: (label, URL name).
        "pack_pages": [link for pack in installed_packs() for link in pack.nav],
    }
