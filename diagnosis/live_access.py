"""Who may watch, read again at every pull: a live socket outlives the sign-in and the
roles it was opened with. `check_and_render` is the checked pull: the events are read
first, under the roles the viewer's last check found, and the roles after, so an event
committed after a role was taken away is never sent."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from django.contrib.auth import get_user_model

from aero.roles import ALL_ROLES, VIEW_SESSIONS
from aero.sessions import Viewer, signed_in
from diagnosis import live_render
from diagnosis.live_render import Pull, Update
from diagnosis.models import Session

CLOSE_SIGNED_OUT = 4401  # the sign-in the socket was opened with ended
CLOSE_FORBIDDEN = 4403  # no (longer a) role that may watch this, or no longer signed in
CLOSE_GONE = 4404  # the session does not exist or was deleted


def last_seqs(session_ids: Iterable[str]) -> dict[str, int]:
    """Each session's last seq, one query (deleted ones too: their viewers are closed
    by the pull that follows)."""
    rows = Session.objects.filter(pk__in=list(session_ids)).values_list("pk", "last_seq")
    return {str(pk): last_seq for pk, last_seq in rows}


def current_roles(user_ids: Iterable[Any]) -> dict[Any, frozenset[str]]:
    """Each user's roles as the database says now (never a copy cached on a user object:
    a connection lives for hours). Inactive and unknown users have none. One query."""
    ids = list(user_ids)
    found: dict[Any, set[str]] = {pk: set() for pk in ids}
    rows = (
        get_user_model()
        .objects.filter(pk__in=ids, is_active=True)
        .values_list("pk", "is_superuser", "groups__name")
    )
    for pk, superuser, group in rows:
        if superuser:
            found[pk].update(ALL_ROLES)
        elif group in ALL_ROLES:
            found[pk].add(group)
    return {pk: frozenset(roles) for pk, roles in found.items()}


def viewer_roles(viewers: Iterable[Viewer]) -> dict[Viewer, frozenset[str]]:
    """Each viewer's roles now, none when the sign-in it came with has ended (signed
    out, expired, the password changed): current_roles and aero.sessions.signed_in."""
    wanted = list(viewers)
    found = current_roles({user_id for user_id, _ in wanted if user_id is not None})
    live = signed_in(wanted)
    return {v: found.get(v[0], frozenset()) if v in live else frozenset() for v in wanted}


def user_id_of(scope: dict[str, Any]) -> Any:
    user = scope.get("user")
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    return user.pk


def session_key_of(scope: dict[str, Any]) -> str | None:
    """The key of the sign-in session the socket was opened with (its cookie's)."""
    return getattr(scope.get("session"), "session_key", None) or None


@dataclass(frozen=True)
class Ask:
    """A viewer a notice woke: who (their roles are read now) and what their page shows."""

    user_id: Any
    session_id: str
    after: int
    composer_key: str | None
    language: str | None
    # The roles the viewer's last check found: the render reads the events under them,
    # then the check reads the roles now (check_and_render).
    roles: frozenset[str] = frozenset()
    # The viewer's sign-in session: checked with the roles (none, or ended: no roles).
    session_key: str | None = None


# A viewer whose roles change at every check is given up on after this many renders (its
# socket closes 4403; the page reconnects and is checked afresh).
CHECK_ROUNDS = 3


def check_and_render(asks: list[Ask]) -> list[tuple[frozenset[str] | None, Update | None]]:
    """For each viewer: their roles as the database says now (None when they may no
    longer watch) and the update their page needs (None when the session is gone). One
    render_batch, in which viewers with the same roles and page share one render (so
    masking stays per role set), then one query for the roles of all of them.

    The events are read first (under the roles each viewer's last check found), the roles
    after (as the API stream does): an event committed after a
    role was taken away can only have been read before a check that sees it gone, so it
    is never sent. A viewer whose roles changed otherwise gets a render under the new
    ones (its masks and forms follow them), checked again; after CHECK_ROUNDS, closed.

    Within live_render.leaving_claimed (the hub's fan-out), a render another process
    claimed comes back a live_render.Claimed, the roles checked all the same: its key holds the
    session's last_seq as read here, before the check, and the render holds no event
    after it, so what it is fetched as was committed before the check too."""
    pulls = [Pull(a.roles, a.session_id, a.after, a.composer_key, a.language) for a in asks]
    answers: list[tuple[frozenset[str] | None, Update | None]] = [(None, None)] * len(asks)
    unsettled = list(range(len(asks)))
    for _ in range(CHECK_ROUNDS):
        distinct = list(dict.fromkeys(pulls[i] for i in unsettled))
        updates = dict(zip(distinct, live_render.render_batch(distinct), strict=True))
        found = viewer_roles({(asks[i].user_id, asks[i].session_key) for i in unsettled})
        changed: list[int] = []
        for i in unsettled:
            roles = found.get((asks[i].user_id, asks[i].session_key), frozenset())
            if not roles & set(VIEW_SESSIONS):
                answers[i] = (None, None)
            elif roles != pulls[i].roles:
                pulls[i] = replace(pulls[i], roles=roles)
                changed.append(i)
            else:
                answers[i] = (roles, updates[pulls[i]])
        unsettled = changed
        if not unsettled:
            break
    return answers
