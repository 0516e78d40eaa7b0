"""An audit entry in the reader's words: its action, who did it and each detail's name
and value, worded from the logged codes. The entry keeps its codes (an auditor filters
and exports by them): the page puts them in tooltips, and a value AERO cannot word is
shown as logged, as data (`<code>`), or quoted when a person typed it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.utils.functional import Promise
from django.utils.translation import gettext, pgettext, pgettext_lazy
from django.utils.translation import gettext_lazy as _

from aero.roles import ROLE_LABELS

ACTION_LABELS: dict[str, Promise] = {
    "action.refused": _("action refused"),
    "api.call": _("API call"),
    "api_token.created": _("API token created"),
    "api_token.revoked": _("API token revoked"),
    "approval.approved": _("approved"),
    "approval.confirmed": _("approval confirmed"),
    "approval.first_approved": _("approved once (1 of 2)"),
    "approval.rejected": _("rejected"),
    "approval.args_edited": _("arguments changed"),
    "approval.timeout": _("approval timed out"),
    "audit.exported": _("audit log downloaded"),
    "auth.locked_out": _("locked out"),
    "auth.lockout_lifted": _("lockout lifted"),
    "auth.sign_in_failed": _("sign-in failed"),
    "auth.signed_in": _("signed in"),
    "auth.signed_out": _("signed out"),
    "ingest.delivered": _("alert delivered"),
    "knowledge.created": _("past case created"),
    "knowledge.deleted": _("past case deleted"),
    "knowledge.saved": _("past case saved"),
    "mcp_server.secrets_changed": _("tool server secrets changed"),
    "mcp_server.tested": _("tool server tested"),
    "metrics_source.tested": _("metrics source tested"),
    "provider.tested": _("model provider tested"),
    "report.exported": _("report downloaded"),
    "restriction.lift_requested": _("lift of a restriction requested"),
    "restriction.lifted": _("restriction lifted"),
    "scenario.exported": _("scenario exported"),
    "scenario.imported": _("scenario imported"),
    "scenario.published": _("scenario published"),
    "scenario.created": _("scenario created"),
    "scenario.draft_saved": _("scenario draft saved"),
    "scenario.deleted": _("scenario deleted"),
    "secrets.rotated": _("secrets rotated"),
    "session.bundle_downloaded": _("evidence bundle downloaded"),
    "session.canceled": _("session canceled"),
    "session.closed": _("session closed"),
    "session.created": _("session opened"),
    "session.deleted": _("session deleted"),
    "session.exported": _("session exported"),
    "session.retried": _("session retried"),
    "todo.resolved": _("to-do resolved"),
    "user.created": _("user created"),
    "user.changed": _("user changed"),
    "user.deleted": _("user deleted"),
    "user.privileges_changed": _("user privileges changed"),
    "user.roles_changed": _("user roles changed"),
    "role.created": _("role created"),
    "role.changed": _("role changed"),
    "role.deleted": _("role deleted"),
}

# The detail names entries log, in words.
DETAIL_LABELS: dict[str, Promise] = {
    "address": _("address"),
    "after": pgettext_lazy("audit detail", "after"),
    "approvals_closed": _("approvals closed"),
    "args": _("arguments"),
    "base_url": _("address of the service"),
    "before": pgettext_lazy("audit detail", "before"),
    "breaker_closed": _("circuit breaker closed"),
    "bulk": _("in bulk"),
    "changed": pgettext_lazy("audit detail", "changed"),
    "changes": pgettext_lazy("audit detail", "changes"),
    "characters": _("characters"),
    "command": _("command"),
    "created": pgettext_lazy("audit detail", "created"),
    "deadline": _("deadline"),
    "digest": _("digest"),
    "draft": _("draft"),
    "events": _("events"),
    "failures": _("failures"),
    "fields": _("fields"),
    "for": pgettext_lazy("audit detail", "for"),
    "format": _("format"),
    "group": _("role"),
    "in_force": _("already in force"),
    "key": _("key"),
    "kind": pgettext_lazy("audit detail", "kind"),
    "masked": _("masked"),
    "message": _("message"),
    "metric": _("metric"),
    "mode": _("mode"),
    "name": _("name"),
    "names": _("names"),
    "note": _("note"),
    "now": pgettext_lazy("audit detail", "now"),
    "object": _("object"),
    "ok": _("succeeded"),
    "prefix": _("prefix"),
    "previous": _("previous"),
    "providers": _("providers"),
    "reason": _("reason"),
    "risk_class": _("risk class"),
    "roles": _("roles"),
    "scenario": _("scenario"),
    "slug": _("scenario code"),
    "source": _("source"),
    "status": _("status"),
    "summary": _("summary"),
    "target": _("target"),
    "title": _("title"),
    "todo": _("to-do"),
    "tool": _("action"),
    "user": _("user"),
    "username": _("username"),
    "version": _("version"),
}

# What people typed: quoted as written.
TYPED = frozenset({"reason", "summary", "note", "title", "message"})
# Values that are roles (group names): each in words.
ROLE_KEYS = frozenset({"roles", "group", "now", "added", "removed"})

# The actor of an entry no person made.
ACTOR_LABELS: dict[str, Promise] = {
    "system": _("system"),
    "sweeper": _("deadline sweeper"),
}

# Words an app gives a detail's value (the tool of a decision, its arguments):
# (value, the whole detail) -> words, or None to show it as logged. Registered at ready.
ValueWords = Callable[[Any, dict[str, Any]], str | None]
_value_words: dict[str, ValueWords] = {}


def register_value_words(key: str, words: ValueWords) -> None:
    _value_words.setdefault(key, words)


def action_words(code: str) -> str:
    label = ACTION_LABELS.get(code)
    return str(label) if label is not None else code


def actor_words(label: str) -> str:
    found = ACTOR_LABELS.get(label)
    return str(found) if found is not None else label


def _roles(value: Any) -> str | None:
    names = value if isinstance(value, list) else [value]
    if not names or not all(str(n) in ROLE_LABELS for n in names):
        return None
    return pgettext("list separator", ", ").join(str(ROLE_LABELS[str(n)]) for n in names)


def detail_rows(detail: Any) -> list[dict[str, Any]]:
    """Each detail as {key, label, value, kind}: kind "words" (worded), "typed" (quote
    it) or "data" (as logged, <code>)."""
    if not isinstance(detail, dict):
        return []
    rows = []
    for key, value in detail.items():
        label = DETAIL_LABELS.get(key)
        row: dict[str, Any] = {"key": key, "label": str(label) if label else key}
        words = _value_words[key](value, detail) if key in _value_words else None
        if words is None and key in ROLE_KEYS:
            words = _roles(value)
        if words is None and isinstance(value, bool):
            words = gettext("yes") if value else gettext("no")
        if words is None and value in (None, "", [], {}):
            words = "—"
        if words is not None:
            row.update(value=words, kind="words")
        elif key in TYPED:
            row.update(value=str(value), kind="typed")
        elif isinstance(value, int | float):
            row.update(value=str(value), kind="words")
        else:
            row.update(value=value, kind="data")
        rows.append(row)
    return rows
