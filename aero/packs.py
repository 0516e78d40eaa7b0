"""Domain packs: everything a domain knows, registered by the pack's own app.

The core picks a pack from a scenario version's kind with `pack_for(kind)` and never
imports a pack: a pack registers itself in its AppConfig.ready(), so a deployment
without a pack installed simply has no scenarios of that kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class UnknownDomain(LookupError):
    """No installed pack serves this scenario kind."""


@dataclass
class DomainPack:
    """One domain's parts. The fields grow as parts move out of the core; each is
    optional only while its move is under way."""

    kind: str  # the scenario kind this pack serves, e.g. "apron"
    app_label: str
    label: dict[str, str]  # the domain's name per language, {"zh": ..., "en": ...}
    definition_model: Any = None  # pydantic model of a scenario definition of this kind
    tools: Any = None  # the pack's tool registry


_PACKS: dict[str, DomainPack] = {}


def register(pack: DomainPack) -> None:
    """Called once per pack from its AppConfig.ready(); a second kind holder is a bug."""
    holder = _PACKS.get(pack.kind)
    if holder is not None and holder.app_label != pack.app_label:
        raise RuntimeError(f"scenario kind {pack.kind!r} is served by {holder.app_label} already")
    _PACKS[pack.kind] = pack


def pack_for(kind: str) -> DomainPack:
    try:
        return _PACKS[kind]
    except KeyError:
        raise UnknownDomain(f"no installed domain pack serves scenario kind {kind!r}") from None


def installed_packs() -> list[DomainPack]:
    return list(_PACKS.values())
