"""What a job loads to start besides the session: its scenario's definition, the world
the agent acts on and the graph's first input, each from the pack of the definition's
kind (aero.packs). The lease statement reads the stamped world's stamp with the lease
(`world_stamp_sql`, from the pack's `world_stamp` model), so a job builds that world
again only when it changed."""

from __future__ import annotations

from typing import Any

from aero.packs import pack_for, stamped_pack
from diagnosis.models import Session
from scenarios_admin.models import ScenarioVersion

# The world a job's agent acts on (AgentContext.graph).
World = Any
# The active world's stamp as the lease statement read it, or None when there is none.
WorldStamp = tuple[Any, Any] | None

# Published scenario versions are immutable (ScenarioVersion.save): their definitions,
# read once per process.
_definitions: dict[int, dict[str, Any]] = {}


def definition_of(session: Session) -> dict[str, Any]:
    found = _definitions.get(session.scenario_version_id)
    if found is None:
        found = ScenarioVersion.objects.values_list("definition", flat=True).get(
            pk=session.scenario_version_id
        )
        _definitions[session.scenario_version_id] = found
    return found


def world_of(kind: str, stamp: WorldStamp = None) -> World:
    """The world of the pack serving `kind` (None when the pack acts on none)."""
    loader = pack_for(kind).world
    return loader(stamp) if loader is not None else None


def initial_state(session: Session, definition: dict[str, Any]) -> dict[str, Any]:
    """The graph's first input for a new session, as its pack builds it."""
    build = pack_for(definition["kind"]).initial_state
    if build is None:
        return {"session_id": str(session.pk), "language": session.language}
    return build(session, definition)


def world_stamp_sql(connection: Any) -> tuple[str, str]:
    """The lease statement's part that reads the active world's stamp: a LEFT JOIN to add
    after its other sources, and the columns it selects (`world_stamp` reads them back).
    Without a stamped world installed, two NULL columns and no join."""
    pack = stamped_pack()
    if pack is None:
        return "", "NULL AS world_id, NULL AS world_updated_at"
    quote = connection.ops.quote_name
    meta = pack.world_stamp._meta
    updated_at = quote(str(meta.get_field("updated_at").column))
    is_active = quote(str(meta.get_field("is_active").column))
    join = (
        f" LEFT JOIN (SELECT {quote('id')}, {updated_at} FROM {quote(meta.db_table)}"
        f" WHERE {is_active} ORDER BY 1 LIMIT 1) stamp ON TRUE"
    )
    columns = f"stamp.{quote('id')} AS world_id, stamp.{updated_at} AS world_updated_at"
    return join, columns


# How many columns world_stamp_sql selects.
WORLD_STAMP_COLUMNS = 2


def world_stamp(columns: tuple[Any, ...]) -> WorldStamp:
    """The stamp from the columns world_stamp_sql selected."""
    world_id, updated_at = columns
    return (world_id, updated_at) if world_id is not None else None
