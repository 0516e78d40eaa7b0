"""Restrictions in force: what an executed action put on a pack's world until it is
lifted. The rows are the pack's own model (`DomainPack.restrictions`); the core reads
them through these functions (the approvals, the lift, the agent's proposals)."""

from __future__ import annotations

from typing import Any

from aero.compiled import Compiled
from aero.packs import restriction_model


def model() -> Any:
    """The restriction model; LookupError when no installed pack keeps restrictions."""
    found = restriction_model()
    if found is None:
        raise LookupError("no installed domain pack keeps restrictions")
    return found


# Read by every queue page and card: compiled once per connection (per model).
_in_force: dict[Any, Compiled[Any]] = {}


def in_force() -> list[Any]:
    """Every restriction in force (none when no pack keeps restrictions)."""
    found = restriction_model()
    if found is None:
        return []
    read = _in_force.get(found)
    if read is None:
        read = _in_force.setdefault(
            found, Compiled(found, lambda: found.objects.filter(lifted_at__isnull=True))
        )
    return list(read.rows())


def kinds() -> dict[str, Any]:
    """The restriction kinds by value, with their labels (lazy texts)."""
    found = restriction_model()
    return dict(found._meta.get_field("kind").flatchoices) if found is not None else {}


def label(kind: str) -> str:
    """A restriction kind in words, in the active language (the kind itself if unknown)."""
    return str(kinds().get(kind, kind))
