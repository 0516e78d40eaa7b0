"""A flight planned at another stand than the position the operator gave: one of the
two is wrong, and the impact analysis (and the closures it proposes) starts at the
position given. The operator, the approvers and the report all say so."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client, override_settings
from django.urls import reverse

from packs.airport.lookups import stand_mismatch
from replay.export import summarize
from tests.web_helpers import STAND_FUEL_LEAK, waiting_session

# CA1234 is planned at stand 105 (demo_airport.yaml); the operator reports 106.
OTHER_STAND_LEAK = "CA1234 在106机位燃油泄漏，发动机仍在运转，还在持续漏"
WARNING = (
    "The flight plan puts CA1234 at stand 105, not 106 as reported: the impact analysis"
    " starts at 106."
)


def enrichment(plan_stand: Any, node: str, kind: str = "stand") -> dict[str, Any]:
    return {
        "flight_plan": {"flight_no": "CA1234", "stand": plan_stand},
        "stand_location": {"node_id": node, "kind": kind},
        "degraded": [],
    }


@pytest.mark.parametrize(
    ("found", "expected"),
    [
        (enrichment("105", "106"), {"flight_no": "CA1234", "planned": "105", "reported": "106"}),
        (enrichment("105", "105"), None),
        # A taxiing aircraft is not at its stand: no contradiction.
        (enrichment("105", "A3", kind="taxiway"), None),
        (enrichment(None, "106"), None),  # a flight with no stand in its plan
        ({"stand_location": {"node_id": "106", "kind": "stand"}, "degraded": []}, None),
        ({"flight_plan": {"flight_no": "CA1234", "stand": "105"}, "degraded": []}, None),
        ("***", None),  # masked for the viewer
        (None, None),
    ],
)
def test_a_mismatch_is_a_stand_position_other_than_the_planned_stand(
    found: Any, expected: Any
) -> None:
    assert stand_mismatch(found) == expected


def warnings_in(html: str) -> list[str]:
    return [
        re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", text)).strip()
        for text in re.findall(r'data-testid="stand-mismatch"[^>]*>(.*?)</(?:li|p|strong)>', html)
    ]


@pytest.mark.services
def test_the_operator_and_the_approvers_are_told_the_flight_is_planned_elsewhere(
    builtin: None, make_user: Callable[..., User]
) -> None:
    olga, abel = make_user("olga", "operator"), make_user("abel", "approver")
    session = waiting_session(olga, OTHER_STAND_LEAK)
    operator = Client()
    operator.force_login(olga)
    page = operator.get(reverse("diagnosis:session-detail", args=[session.pk])).content.decode()
    # In the facts beside the timeline, and on the timeline's lookup line.
    found = warnings_in(page)
    assert len(found) == 2 and all(w.startswith(WARNING) for w in found)

    approver = Client()
    approver.force_login(abel)
    queue = approver.get(reverse("approvals:queue")).content.decode()
    incident = queue[queue.index(f'id="incident-{session.pk}"') :]
    assert warnings_in(incident)[0].startswith(WARNING)

    with override_settings(LANGUAGE_CODE="zh-hans"):
        zh = operator.get(
            reverse("diagnosis:session-detail", args=[session.pk]),
            HTTP_ACCEPT_LANGUAGE="zh-hans",
        ).content.decode()
    assert any("航班计划" in w and "105" in w and "106" in w for w in warnings_in(zh))


@pytest.mark.services
def test_no_warning_when_the_flight_is_at_the_stand_reported(
    builtin: None, make_user: Callable[..., User]
) -> None:
    olga, abel = make_user("olga", "operator"), make_user("abel", "approver")
    session = waiting_session(olga, STAND_FUEL_LEAK)
    operator = Client()
    operator.force_login(olga)
    page = operator.get(reverse("diagnosis:session-detail", args=[session.pk])).content.decode()
    approver = Client()
    approver.force_login(abel)
    queue = approver.get(reverse("approvals:queue")).content.decode()
    assert "stand-mismatch" not in page and "stand-mismatch" not in queue


def test_the_reports_chronology_carries_the_warning() -> None:
    line = summarize(
        "timeline.appended", {"kind": "enrichment", "enrichment": enrichment("105", "106")}
    )
    assert line.startswith("Flight and position looked up: " + WARNING)
    agreed = summarize(
        "timeline.appended", {"kind": "enrichment", "enrichment": enrichment("105", "105")}
    )
    assert agreed == "Flight and position looked up"
