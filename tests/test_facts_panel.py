"""The session page's facts panel and a replay step draw the known fields themselves; what
the apron's analyses found (the lookups, the risk, the impact and its map) is the
airport pack's template, chosen by its pack (DomainPack.facts_template and
replay_facts_template): a pack without one shows the fields only."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User

from aero.packs import DomainPack, pack_for
from diagnosis.models import Session
from tests.web_helpers import login, waiting_session

APRON_FACTS = (
    "<h3>Flight and position</h3>",  # what the lookups found
    'data-testid="risk"',
    "<h3>Impact</h3>",
    '<figure class="map">',
)
REPLAY_FACTS = ('data-testid="risk"', "<h3>Impact</h3>", '<figure class="map">')


@pytest.fixture
def apron(builtin: None) -> Iterator[DomainPack]:
    pack = pack_for("apron")
    templates = (pack.facts_template, pack.replay_facts_template)
    yield pack
    pack.facts_template, pack.replay_facts_template = templates


def _pages(session: Session, alice: User, carol: User) -> tuple[str, str]:
    page = login(alice).get(f"/sessions/{session.pk}/")
    replay = login(carol).get(f"/replay/{session.pk}/?seq={session.last_seq}")
    assert page.status_code == replay.status_code == 200
    return page.content.decode(), replay.content.decode()


@pytest.mark.django_db(transaction=True)
def test_the_apron_facts_are_drawn_by_its_pack(apron: DomainPack, alice: User, carol: User) -> None:
    session = waiting_session(alice)
    page, replay = _pages(session, alice, carol)
    assert all(part in page for part in APRON_FACTS), [p for p in APRON_FACTS if p not in page]
    assert all(part in replay for part in REPLAY_FACTS)
    assert 'data-field="position"' in page and 'data-field="position"' in replay

    # Without the pack's templates the core draws the known fields and nothing else.
    apron.facts_template = apron.replay_facts_template = None
    page, replay = _pages(session, alice, carol)
    assert not [part for part in APRON_FACTS if part in page]
    assert not [part for part in REPLAY_FACTS if part in replay]
    assert 'data-field="position"' in page and 'data-field="position"' in replay
