"""The apron's parts of the core's pages are the airport pack's templates, reached through
its hooks: an incident's card in the approval queue (the risk with what its spread reaches,
DomainPack.card_template), the Markdown export's impact line (export_template) and the
help above the scenario editor's rows (row_help_template). Without them the core's pages
draw their own parts only."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from django.core.cache import caches
from django.urls import reverse

from aero.packs import DomainPack, pack_for
from diagnosis.models import Session
from scenarios_admin.models import Scenario
from tests.web_helpers import login, waiting_session

HOOKS = ("card_template", "export_template", "row_help_template")
# The card's impact: how far the risk reaches from the reported stand, and what.
CARD_IMPACT = re.compile(r"radius \d+ from 105 · taxiways A, B · runways [^·]+ · flights ")
EXPORT_IMPACT = re.compile(
    r"^Impact: radius \d+, from 105; isolated [^;]+; taxiways [^;]+; runways [^;]+; flights .+\.$",
    re.M,
)
HELP = "How to write conditions, lists and arguments"


@pytest.fixture
def apron(builtin: None) -> Iterator[DomainPack]:
    pack = pack_for("apron")
    kept = {hook: getattr(pack, hook) for hook in HOOKS}
    yield pack
    for hook, value in kept.items():
        setattr(pack, hook, value)


def _pages(session: Session, bob: User, carol: User, root: User) -> tuple[str, str, str]:
    # A card is kept by what it shows, not by the template drawing it.
    caches["queue_cards"].clear()
    queue = login(bob).get(reverse("approvals:queue"))
    export = login(carol).post(reverse("replay:replay-export", args=[session.pk]))
    oil_spill = Scenario.objects.get(slug="oil_spill")
    editor = login(root).get(reverse("admin:scenarios_admin_scenario_change", args=[oil_spill.pk]))
    assert queue.status_code == export.status_code == editor.status_code == 200
    return queue.content.decode(), export.content.decode(), editor.content.decode()


@pytest.mark.django_db(transaction=True)
def test_the_apron_parts_of_core_pages_are_drawn_by_its_pack(
    apron: DomainPack, alice: User, bob: User, carol: User
) -> None:
    root = User.objects.create_superuser("root", password="pw-for-tests")
    session = waiting_session(alice)
    queue, export, editor = _pages(session, bob, carol, root)
    assert CARD_IMPACT.search(re.sub(r"\s+", " ", queue))
    assert 'class="risk risk-high"' in queue
    assert EXPORT_IMPACT.search(export)
    assert HELP in editor and "<code>{fields.position}</code>" in editor

    # Without the pack's templates the core's pages draw their own parts only.
    for hook in HOOKS:
        setattr(apron, hook, None)
    queue, export, editor = _pages(session, bob, carol, root)
    assert not CARD_IMPACT.search(re.sub(r"\s+", " ", queue))
    assert 'class="risk' not in queue and 'data-testid="incident"' in queue
    assert not EXPORT_IMPACT.search(export) and "## 2. Conclusion" in export
    assert HELP not in editor and 'id="scenario_form"' in editor
