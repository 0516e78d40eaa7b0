"""Which scenario a message reads like: the synonym match score.

Deterministic and cheap (no LLM, no graph): each enum/bool field whose synonyms occur in
the message counts one, the scenario's own name counts three. Used before a session
starts (no scenario is preselected: the form suggests one) and after the first message
(the agent says so when another scenario fits better, and offers to switch).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db.models import OuterRef, Subquery

from aero.packs import installed_packs
from diagnosis.agent.reading import occurrences
from scenarios_admin.models import Scenario, ScenarioVersion

NAME_WEIGHT = 3


@dataclass(frozen=True)
class Fit:
    scenario: Scenario
    score: int
    # The words of the message that matched, in the order found (for the "why").
    words: list[str] = field(default_factory=list)


def fit_of(definition: dict[str, Any], names: tuple[str, ...], text: str) -> tuple[int, list[str]]:
    lowered = text.lower()
    score = 0
    words: list[str] = []
    for name in names:
        if name and occurrences(lowered, name.lower()):
            score += NAME_WEIGHT
            words.append(name)
            break
    for spec in definition.get("fields", {}).values():
        if spec.get("type") not in ("enum", "bool"):
            continue
        # Longest synonym first: "无碎片" is the word, not "碎片" inside it.
        synonyms = sorted(
            (str(s) for v in (spec.get("values") or {}).values() for s in v.get("synonyms", [])),
            key=len,
            reverse=True,
        )
        for synonym in synonyms:
            if occurrences(lowered, synonym.lower()):
                score += 1
                words.append(synonym)
                break
    return score, words


def rank(text: str) -> list[Fit]:
    """Active, published scenarios by how well the message fits, best first; only those
    with a score above zero."""
    fits = []
    # Each active scenario's newest version, in one query (not one per scenario: this
    # runs on every session created).
    newest = ScenarioVersion.objects.filter(scenario=OuterRef("scenario")).order_by("-number")
    versions = (
        ScenarioVersion.objects.filter(
            scenario__is_active=True,
            # Only kinds whose sessions start from a message (not an evidence file).
            scenario__kind__in=[p.kind for p in installed_packs() if p.opens_from_message],
            number=Subquery(newest.values("number")[:1]),
        )
        .select_related("scenario")
        .order_by("scenario__slug")
    )
    for version in versions:
        scenario = version.scenario
        score, words = fit_of(version.definition, (scenario.name_zh, scenario.name_en), text)
        if score:
            fits.append(Fit(scenario, score, words))
    return sorted(fits, key=lambda f: -f.score)


def suggestion(text: str) -> Fit | None:
    """The best fit, when one scenario fits strictly better than every other."""
    fits = rank(text)
    if not fits or (len(fits) > 1 and fits[1].score == fits[0].score):
        return None
    return fits[0]


# How much better another scenario must fit before AERO interrupts the operator's choice:
# one shared word ("机位" names a stand in two scenarios) is no evidence of a wrong choice.
MISMATCH_MARGIN = 2


def better_fit(scenario: Scenario, text: str) -> Fit | None:
    """Another scenario the message fits clearly better than the chosen one, if any."""
    fits = rank(text)
    own = next((f.score for f in fits if f.scenario.pk == scenario.pk), 0)
    best = fits[0] if fits else None
    if best is None or best.scenario.pk == scenario.pk or best.score < own + MISMATCH_MARGIN:
        return None
    return best
