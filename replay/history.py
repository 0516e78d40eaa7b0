"""History search over sessions (indexes: replay migrations 0001 and 0002).

Facts from the snapshot (the risk level; a pack's filters, such as the apron's flight and
position) are compared through the exact expressions the expression indexes are built
on; free text goes to PostgreSQL full text plus trigram (Chinese has no word breaks,
trigrams match inside it) or to SQLite FTS5 with its trigram tokenizer. Pages are
keyset-paginated on (sort column, id)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, time
from typing import Any
from uuid import UUID

from django.db import connection
from django.db.models import Q, QuerySet
from django.db.models.expressions import RawSQL
from django.utils import timezone

from aero.packs import HistoryFilter, history_filters
from diagnosis.eventlog import masking
from diagnosis.models import Session

PAGE = 50
ROW_FIELDS = (
    "id",
    "title",
    "status",
    "created_at",
    "updated_at",
    "scenario__name_en",
    "scenario__name_zh",  # |scenario_name shows the one of the page language
    "scenario__slug",  # the API lists it (api/history.py)
    "created_by__username",
)
ROW_FACTS = ("risk", "closed_by")
SORT_COLUMNS = {"-created": "created_at", "created": "created_at", "-updated": "updated_at"}

# The same text the indexes are built on (replay migration 0001): keep them in step.
PG_FACTS = {
    "risk": "(\"diagnosis_session\".\"snapshot\" -> 'risk' ->> 'level')",
    # Closed by the operator with a summary (a row only, no index, no filter)
    "closed_by": "(\"diagnosis_session\".\"snapshot\" -> 'closed' ->> 'by')",
}
SQLITE_FACTS = {
    "risk": 'json_extract("diagnosis_session"."snapshot", \'$.risk.level\')',
    "closed_by": 'json_extract("diagnosis_session"."snapshot", \'$.closed.by\')',
}
# One search document per session (replay.models.SessionSearch: operator messages and
# report, kept by a trigger in the events' transaction). Trigram ILIKE finds the text
# anywhere (Chinese has no word breaks); the stored English tsvector adds stemmed words
# ("leaking" finds "leak"), asked only when the text has a Latin letter (for CJK text the
# English parser adds nothing). A session matches at most once, so the planner can walk
# sessions newest-first and probe each one's document until the page is full (a term in
# a sixth of all sessions), or collect a rare term's few documents from the GIN index and
# sort them.
PG_TEXT = "SELECT session_id FROM replay_session_search WHERE document ILIKE %s"
PG_TEXT_WORDS = (
    "SELECT session_id FROM replay_session_search "
    "WHERE document ILIKE %s OR words @@ plainto_tsquery('english', %s)"
)
# The document as the events make it (the trigger's CASE, string_agg in seq order).
PG_REBUILD = """
    INSERT INTO replay_session_search (session_id, document)
    SELECT e.session_id, string_agg(
               coalesce(CASE WHEN e.type = 'report.ready' THEN e.payload ->> 'markdown'
                             ELSE e.payload ->> 'text' END, ''),
               E'\\n' ORDER BY e.seq)
      FROM diagnosis_event e
     WHERE e.type IN ('user.message', 'report.ready') {only}
     GROUP BY e.session_id
    ON CONFLICT (session_id) DO UPDATE SET document = EXCLUDED.document
"""
_LATIN = re.compile(r"[A-Za-z]")
SQLITE_TEXT_MATCH = "SELECT session_id FROM replay_search WHERE replay_search MATCH %s"
SQLITE_TEXT_LIKE = "SELECT session_id FROM replay_search WHERE body LIKE %s ESCAPE '\\'"


@dataclass
class Page:
    rows: list[dict[str, Any]]
    next_cursor: str


def _like(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def text_condition(text: str) -> Q:
    if connection.vendor == "postgresql":
        if _LATIN.search(text):
            return Q(pk__in=RawSQL(PG_TEXT_WORDS, (_like(text), text)))
        return Q(pk__in=RawSQL(PG_TEXT, (_like(text),)))
    if len(text) >= 3:
        # A phrase query: quotes inside are doubled, so the text cannot be FTS5 syntax.
        phrase = '"' + text.replace('"', '""') + '"'
        return Q(pk__in=RawSQL(SQLITE_TEXT_MATCH, (phrase,)))
    return Q(pk__in=RawSQL(SQLITE_TEXT_LIKE, (_like(text),)))  # the trigram index needs 3


def rebuild_documents(session_ids: list[UUID] | None = None) -> int:
    """Rebuild search documents from the event log (all, or these sessions'): the table is
    derived, so a lost or doubted row is recomputed, never edited. PostgreSQL only (the
    embedded FTS5 table is kept by its own triggers). Returns the rows written."""
    only, params = "", []
    if session_ids is not None:
        only, params = "AND e.session_id = ANY(%s)", [list(session_ids)]
    with connection.cursor() as cursor:
        cursor.execute(PG_REBUILD.format(only=only), params)
        return cursor.rowcount


def fact(name: str) -> RawSQL:
    facts = PG_FACTS if connection.vendor == "postgresql" else SQLITE_FACTS
    return RawSQL(facts[name], ())


def pack_filters() -> dict[str, HistoryFilter]:
    return history_filters()


_KEY = re.compile(r"^[a-z_][a-z0-9_]*$")


def pack_fact(item: HistoryFilter) -> RawSQL:
    """A pack's fact out of the snapshot as text, written as the pack's expression index
    is (literal keys: a bound array would not match it), so a filter can use it."""
    if not all(_KEY.match(key) for key in item.path):
        raise ValueError(f"history filter {item.name}: keys must be identifiers")
    if connection.vendor == "postgresql":
        *outer, last = item.path
        steps = "".join(f" -> '{key}'" for key in outer)
        return RawSQL(f'("diagnosis_session"."snapshot"{steps} ->> \'{last}\')', ())
    return RawSQL(f'json_extract("diagnosis_session"."snapshot", \'$.{".".join(item.path)}\')', ())


def parse_cursor(cursor: str) -> tuple[datetime, UUID]:
    """`<iso time>~<session id>`; ValueError for anything else."""
    stamp, _, pk = cursor.partition("~")
    moment = datetime.fromisoformat(stamp)
    if timezone.is_naive(moment):
        raise ValueError("cursor time has no zone")
    return moment, UUID(pk)


def search_queryset(data: dict[str, Any]) -> QuerySet[Session]:
    sessions = Session.objects.visible()
    if data.get("scenario"):
        sessions = sessions.filter(scenario=data["scenario"])
    if data.get("status"):
        sessions = sessions.filter(status=data["status"])
    if data.get("risk"):
        sessions = sessions.alias(fact_risk=fact("risk")).filter(fact_risk=data["risk"])
    for name, item in pack_filters().items():
        if data.get(name):
            sessions = sessions.alias(**{f"pack_{name}": pack_fact(item)}).filter(
                **{f"pack_{name}": data[name]}
            )
    if data.get("creator"):
        sessions = sessions.filter(created_by__username=data["creator"])
    zone = timezone.get_current_timezone()
    if data.get("since"):
        sessions = sessions.filter(created_at__gte=datetime.combine(data["since"], time.min, zone))
    if data.get("until"):
        sessions = sessions.filter(created_at__lte=datetime.combine(data["until"], time.max, zone))
    if data.get("q"):
        sessions = sessions.filter(text_condition(data["q"].strip()))
    return sessions


def search(
    data: dict[str, Any], limit: int | None = None, roles: frozenset[str] | None = None
) -> Page:
    """`limit`: rows a page (PAGE, read at call time); `roles`: the viewer's, a masked
    viewer's text search finds no session by a value the masking rule hides in it."""
    limit = PAGE if limit is None else limit
    sort = data.get("sort") or "-created"
    column = SORT_COLUMNS[sort]
    descending = sort.startswith("-")
    sessions = search_queryset(data)
    if data.get("cursor"):
        moment, pk = parse_cursor(data["cursor"])
        if descending:
            sessions = sessions.filter(
                Q(**{f"{column}__lt": moment}) | Q(**{column: moment, "pk__lt": pk})
            )
        else:
            sessions = sessions.filter(
                Q(**{f"{column}__gt": moment}) | Q(**{column: moment, "pk__gt": pk})
            )
    order = [f"-{column}", "-pk"] if descending else [column, "pk"]
    # Only what a row shows: the facts come out of the snapshot in SQL (the same
    # expressions as the filters), so a page never decodes 50 whole snapshots (impact,
    # enrichment, evidence) nor loads the users' password hashes.
    packs = pack_filters()
    page = (
        sessions.select_related("scenario", "created_by")
        .only(*ROW_FIELDS)
        .annotate(**{f"row_{name}": fact(name) for name in ROW_FACTS})
        .annotate(**{f"packrow_{name}": pack_fact(item) for name, item in packs.items()})
        .order_by(*order)
    )
    found = list(page[: limit + 1])
    more = len(found) > limit
    found = found[:limit]
    hidden: set[Any] = set()
    if data.get("q") and roles is not None and masking.masks_roles(roles):
        hidden = masking.hiding(data["q"].strip(), [s.pk for s in found])
    chosen = {name: item for name, item in packs.items() if not item.column}
    rows: list[dict[str, Any]] = [
        {
            "session": s,
            **{name: getattr(s, f"row_{name}") or "" for name in ROW_FACTS},
            # a pack's facts of this session (empty ones left out: another kind's session)
            "facts": {
                name: str(value) for name in chosen if (value := getattr(s, f"packrow_{name}"))
            },
            # the packs' columns, each in every row ("" where the session has none)
            "columns": {
                name: str(getattr(s, f"packrow_{name}") or "")
                for name, item in packs.items()
                if item.column
            },
        }
        for s in found
        if s.pk not in hidden
    ]
    if chosen:
        words = {
            name: dict(item.choices() if item.choices else []) for name, item in chosen.items()
        }
        for row in rows:
            facts: dict[str, str] = row["facts"]
            row["fact_labels"] = [
                (name, words[name].get(value, value)) for name, value in facts.items()
            ]
    next_cursor = ""
    if more and found:
        last = found[-1]
        next_cursor = f"{getattr(last, column).isoformat()}~{last.pk.hex}"
    return Page(rows=rows, next_cursor=next_cursor)
