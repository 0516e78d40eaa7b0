"""Restrictions in force: what an executed action put on a pack's world until it is
lifted. The rows are the pack's own model (`DomainPack.restrictions`); the core reads
them through these functions (the approvals, the lift, the agent's proposals)."""

from __future__ import annotations

from typing import Any

from aero.packs import restriction_model


def model() -> Any:
    """The restriction model; LookupError when no installed pack keeps restrictions."""
    found = restriction_model()
    if found is None:
        raise LookupError("no installed domain pack keeps restrictions")
    return found


def in_force() -> list[Any]:
    """Every restriction in force (none when no pack keeps restrictions)."""
    found = restriction_model()
    return list(found.objects.filter(lifted_at__isnull=True)) if found is not None else []


def kinds() -> dict[str, Any]:
    """The restriction kinds by value, with their labels (lazy texts)."""
    found = restriction_model()
    return dict(found._meta.get_field("kind").flatchoices) if found is not None else {}


def label(kind: str) -> str:
    """A restriction kind in words, in the active language (the kind itself if unknown)."""
    return str(kinds().get(kind, kind))
