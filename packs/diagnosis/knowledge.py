"""The knowledge base: seeded from the demo shop's knowledge items, searched for the past
cases most like an incident (the `similar_cases` evidence tool, called while the evidence
is gathered), and grown by completed sessions saved into it.

The search (no vector database, seed 003's scheme A): full text and trigram similarity
over each item's `search_text`, in PostgreSQL `to_tsvector('simple')` with
`ts_rank_cd` and pg_trgm's `similarity`; in the embedded SQLite mode an FTS5 table
(trigram tokenizer, bm25) and the same trigram similarity computed here. Without FTS5
(an SQLite built without it) the words the two texts share stand in for the rank. The
text score is then weighed with the services the caller names."""

from __future__ import annotations

import re
import sqlite3
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from django.db import DatabaseError, IntegrityError, connection, transaction
from django.utils.translation import gettext as _
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from aero.models import audit
from diagnosis.actions import ActionError
from diagnosis.eventlog.write import lock_session
from diagnosis.events import append_event
from diagnosis.models import Session, SessionStatus
from packs.diagnosis.models import KnowledgeItem, KnowledgeSource, SimilarCase
from packs.diagnosis.names import SAVED
from packs.diagnosis.system import System

SHOWN = 3  # the page, the report and the export show the best three
KEPT = 5  # links stored per session
CANDIDATES = 50
MAX_TEXT = 4000  # characters of a similar_cases query
# Weights of the score (at most 0.7): the texts' full-text rank and trigram similarity,
# then the services in play.
W_FTS, W_TRGM, W_SERVICES = 0.35, 0.15, 0.2
MIN_SCORE = 0.05
WORD = re.compile(r"[0-9a-z]+|[\u3400-\u9fff]+")
CJK = re.compile(r"[\u3400-\u9fff]")


@dataclass(frozen=True)
class Match:
    item: KnowledgeItem
    score: float
    strategy: str
    fts: float
    trgm: float


# --- seed ------------------------------------------------------------------------------------


def shipped_problem_type(hypothesis: str, tags: list[str]) -> str:
    """The problem type a shipped item is filed under (demo_shop.yaml names only its root
    cause kind): the playbook's own classes, latency tags meaning a slow response."""
    if hypothesis in ("disk_full", "db_pool_exhausted", "memory_leak"):
        return "resource_exhaustion"
    if hypothesis == "db_primary_down":
        return "service_down"
    return "slow_response" if "latency" in tags else "error_spike"


def seed_knowledge(system: System) -> list[str]:
    """Create the system's shipped knowledge items that are not there yet (an admin's edit
    of one is kept)."""
    made = []
    for entry in system.knowledge:
        if KnowledgeItem.objects.filter(key=entry.id).exists():
            continue
        zh = bool(CJK.search(entry.title + entry.content))
        lang = "zh" if zh else "en"
        KnowledgeItem.objects.create(
            key=entry.id,
            source=KnowledgeSource.SHIPPED,
            hypothesis=entry.hypothesis,
            problem_type=shipped_problem_type(entry.hypothesis, entry.tags),
            services=list(entry.services),
            tags=list(entry.tags),
            # A shipped item is one paragraph in one language: what happened, why and
            # what fixed it, kept whole as its symptoms.
            **{f"title_{lang}": entry.title, f"symptoms_{lang}": entry.content.strip()},
        )
        made.append(entry.id)
    return [f"knowledge items: {', '.join(made)} created"] if made else []


# --- search ----------------------------------------------------------------------------------


def words(text: str) -> list[str]:
    seen: dict[str, None] = {}
    for word in WORD.findall(text.lower()):
        if len(word) > 1:
            seen.setdefault(word, None)
    return list(seen)[:64]


def trigrams(text: str) -> set[str]:
    """pg_trgm's trigrams: each word lowercased, padded with two spaces before and one
    after."""
    grams: set[str] = set()
    for word in WORD.findall(text.lower()):
        padded = f"  {word} "
        grams.update(padded[i : i + 3] for i in range(len(padded) - 2))
    return grams


def trigram_similarity(a: str, b: str) -> float:
    first, second = trigrams(a), trigrams(b)
    if not first or not second:
        return 0.0
    return len(first & second) / len(first | second)


def _pg_candidates(
    text: str, exclude: Any, services: list[str]
) -> tuple[dict[int, tuple[float, float]], str]:
    """Items sharing a word (the GIN tsvector index), close by trigrams (pg_trgm's `%`,
    the trigram index), or naming one of the services."""
    # words hold no quote; no word at all (punctuation only): the empty query, which
    # matches nothing (`''` is a syntax error to to_tsquery)
    query = " | ".join(f"'{w}'" for w in words(text))
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, fts, trgm FROM ("
            " SELECT k.id,"
            "  ts_rank_cd(to_tsvector('simple', k.search_text), q, 32) AS fts,"
            "  similarity(k.search_text, %s) AS trgm"
            " FROM diagnosis_pack_knowledgeitem k, to_tsquery('simple', %s) q"
            " WHERE k.session_id IS DISTINCT FROM %s AND ("
            "  to_tsvector('simple', k.search_text) @@ q OR k.search_text %% %s"
            "  OR k.services ?| %s::text[])"
            ") found ORDER BY fts + trgm DESC, id LIMIT %s",
            [text, query, exclude, text, services, CANDIDATES],
        )
        rows = cursor.fetchall()
    return {row[0]: (float(row[1]), float(row[2])) for row in rows}, "pg_fts+trgm"


def _sqlite_candidates(text: str, exclude: Any) -> tuple[dict[int, tuple[float, float]], str]:
    items = dict(KnowledgeItem.objects.exclude(session_id=exclude).values_list("id", "search_text"))

    def execute(sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return list(cursor.fetchall())

    return embedded_scores(text, items, execute)


Execute = Callable[[str, list[Any]], list[tuple[Any, ...]]]


def embedded_scores(
    text: str, items: dict[int, str], execute: Execute
) -> tuple[dict[int, tuple[float, float]], str]:
    """SQLite's (full-text rank, trigram similarity) of each of `items` (id -> its
    search_text) for `text`: bm25 over the FTS5 table `knowledge_fts` through `execute`
    (sql with %s placeholders, params), else the share of the words found."""
    ranks: dict[int, float] = {}
    # The trigram tokenizer matches strings of three characters or more.
    terms = [w for w in words(text) if len(w) >= 3]
    strategy = "sqlite_fts5+trgm"
    try:
        if terms:
            match = " OR ".join(f'"{t}"' for t in terms)  # words hold no quote
            rows = execute(
                "SELECT item_id, -bm25(knowledge_fts) FROM knowledge_fts "
                "WHERE knowledge_fts MATCH %s",
                [match],
            )
            ranks = {int(k): max(0.0, float(r)) for k, r in rows}
        ranks = {k: r / (r + 1) for k, r in ranks.items()}
    except (DatabaseError, sqlite3.Error):
        # No FTS5 table (an SQLite without FTS5): the share of the query's words found.
        strategy = "words+trgm"
        asked = set(words(text))
        ranks = {
            k: len(asked & set(words(body))) / len(asked) if asked else 0.0
            for k, body in items.items()
        }
    return {
        k: (ranks.get(k, 0.0), trigram_similarity(body, text)) for k, body in items.items()
    }, strategy


def search(
    text: str,
    *,
    service: str = "",
    services: set[str] | None = None,
    exclude: Any = None,
    limit: int = KEPT,
) -> list[Match]:
    """The knowledge items most like `text`, best first: an incident's words with the
    services in play (`service` the most suspected), or a person's free-text query (no
    services: the text's rank and trigram similarity alone). `exclude`: a session whose
    saved item is left out."""
    if not text.strip():
        return []
    services = services or set()
    # No session to leave out: the nil id, which none has (`IS DISTINCT FROM NULL` would
    # leave out every item not saved from a session).
    exclude = uuid.UUID(int=0) if exclude is None else exclude
    if connection.vendor == "postgresql":
        found, strategy = _pg_candidates(text, exclude, sorted(services))
    else:
        found, strategy = _sqlite_candidates(text, exclude)
    # ts_rank_cd's normalization 32 is rank/(rank+1); a few shared words give ~0.1.
    top_fts = max((f for f, _ in found.values()), default=0.0) or 1.0
    items = KnowledgeItem.objects.in_bulk(list(found))
    matches = []
    for item_id, (fts, trgm) in found.items():
        item = items[item_id]
        shared = services & set(item.services)
        overlap = len(shared) / len(services | set(item.services)) if shared else 0.0
        on_service = 1.0 if service and service in item.services else overlap
        score = W_FTS * (fts / top_fts) + W_TRGM * trgm + W_SERVICES * on_service
        if score >= MIN_SCORE:
            matches.append(Match(item, round(score, 3), strategy, round(fts, 4), round(trgm, 4)))
    matches.sort(key=lambda m: (-m.score, m.item.key))
    return matches[:limit]


class SimilarCasesArgs(BaseModel):
    """The `similar_cases(text, services?)` evidence tool's arguments (DIAGNOSIS.md §2)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    text: str = Field(
        min_length=1, max_length=MAX_TEXT, description="what is wrong, in the incident's words"
    )
    services: list[Annotated[str, StringConstraints(min_length=1, max_length=100)]] = Field(
        default_factory=list,
        max_length=50,
        description="the services in play, the most suspected first",
    )


SIMILAR_CASES_DESCRIPTION = (
    "Past incidents like this one: knowledge items and saved sessions, by full text and "
    "trigram similarity, with the services in common."
)


def similar_cases_tool(session_id: Any, args: dict[str, Any]) -> dict[str, Any]:
    """The `similar_cases` evidence tool: the knowledge items most like `args` (its
    schema: SimilarCasesArgs), the session's own saved item left out. Stores the links
    (replacing any a re-run of the step wrote) in the caller's transaction, the step's;
    the result lists them as the `diagnosis.similar_cases` event records them."""
    asked = SimilarCasesArgs.model_validate(args)
    session = Session.objects.only("pk", "language").get(pk=session_id)
    suspect = asked.services[0] if asked.services else ""
    matches = search(asked.text, service=suspect, services=set(asked.services), exclude=session.pk)
    SimilarCase.objects.filter(session_id=session.pk).delete()
    SimilarCase.objects.bulk_create(
        SimilarCase(session_id=session.pk, item=m.item, score=m.score, strategy=m.strategy, rank=i)
        for i, m in enumerate(matches, 1)
    )
    cases = [
        {
            "id": m.item.key,
            "title": m.item.text("title", session.language),
            "score": m.score,
            "strategy": m.strategy,
            "fts": m.fts,
            "trgm": m.trgm,
        }
        for m in matches
    ]
    words = ", ".join(f"{c['id']} ({c['score']})" for c in cases[:SHOWN])
    return {
        "cases": cases,
        "summary": f"{len(cases)} similar past cases" + (f": {words}" if words else ""),
    }


def linked_cases(
    session: Session, limit: int = SHOWN, language: str | None = None
) -> list[dict[str, Any]]:
    """The session's stored similar cases, best first, as the page, the report, the
    export and the JSON show them: in `language` ("zh"/"en", a page passes its reader's),
    else in the session's; an item written in one language only shows in that one."""
    lang = language or ("zh" if session.language == "zh" else "en")
    return [
        {
            "id": link.item.key,
            "title": link.item.text("title", lang),
            "summary": link.item.text("symptoms", lang),
            "root_cause": link.item.text("root_cause", lang),
            "fix": link.item.text("fix", lang),
            "services": link.item.services,
            "hypothesis": link.item.hypothesis,
            "score": link.score,
            "strategy": link.strategy,
            # An item written in the other language only: pages mark it (<q lang>) as
            # quoted, as written.
            "written_in": link.item.written_in(lang),
            "foreign": link.item.written_in(lang) != lang,
        }
        for link in SimilarCase.objects.filter(session=session)
        .select_related("item")
        .order_by("rank")[:limit]
    ]


# --- saving a session ------------------------------------------------------------------------


def do_save_as_knowledge(session_id: Any, user: Any) -> KnowledgeItem:
    """Save a completed diagnosis as a knowledge item (once per session): its title, root
    cause, services and fix in both languages where the session has them. Locks the
    session row; the item, a `diagnosis.knowledge_saved` event and the audit entry commit
    together."""
    with transaction.atomic():
        session = lock_session(session_id)
        cause: dict[str, Any] = (session.snapshot or {}).get("root_cause") or {}
        if session.status != SessionStatus.COMPLETED or not cause:
            raise ActionError(_("Only a completed diagnosis with a root cause can be saved."))
        if KnowledgeItem.objects.filter(session=session).exists():
            raise ActionError(_("This session is already in the knowledge base."))
        summary = cause.get("summary") or {}
        fix = cause.get("fix") or cause.get("action") or {}
        fix_words = (
            f"{fix.get('tool')} {fix.get('args', {}).get('service', '')}".strip() if fix else ""
        )
        services = [cause.get("service"), *cause.get("related_services", [])]
        item = KnowledgeItem.objects.create(
            key=f"S-{session.pk.hex[:8]}",
            source=KnowledgeSource.SESSION,
            session=session,
            created_by=user,
            title_zh=session.title if CJK.search(session.title) else "",
            title_en="" if CJK.search(session.title) else session.title,
            hypothesis=cause.get("hypothesis", ""),
            problem_type=cause.get("problem_type", ""),
            services=list(dict.fromkeys(s for s in services if s)),
            root_cause_zh=summary.get("zh", ""),
            root_cause_en=summary.get("en", ""),
            fix_zh=fix_words,
            fix_en=fix_words,
            tags=[t for t in (cause.get("hypothesis"), cause.get("problem_type")) if t],
        )
        append_event(
            session.pk,
            SAVED,
            {"id": item.key, "item": item.pk, "by": user.get_username()},
            producer="web",
        )
        audit(
            "knowledge.saved",
            obj=item,
            actor=user,
            session_id=session.pk,
            detail={"key": item.key},
        )
    return item


# --- written through the API -----------------------------------------------------------------


def do_create_knowledge(user: Any, fields: dict[str, Any]) -> KnowledgeItem:
    """A knowledge item written by a person (an operator or an admin, through the API), with
    the audit entry the admin's add writes; `key` generated (`K-<8 hex>`) when not given.
    A key already taken is refused."""
    key = fields.pop("key", "") or f"K-{uuid.uuid4().hex[:8]}"
    try:
        with transaction.atomic():
            item = KnowledgeItem.objects.create(
                key=key, source=KnowledgeSource.API, created_by=user, **fields
            )
            audit(
                "knowledge.created",
                obj=item,
                actor=user,
                detail={"key": item.key, "fields": sorted(k for k, v in fields.items() if v)},
            )
    except IntegrityError:
        raise ActionError(_("There is a knowledge item %(id)s already.") % {"id": key}) from None
    return item
