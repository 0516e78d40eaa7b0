"""The core serves a pack it was not written for: the neutral test pack's one lookup,
one action and one finding kind, declared once each (tests/neutral_pack), reach the
policy floors, the board's restriction check, the words of cards, results and timeline,
the approver's edit check, the model's tool list, the enrichment sources and the finding
registry, with no airport word anywhere."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.utils import translation

from aero import packs
from approvals.actions import checked_args
from approvals.models import Approval
from diagnosis.agent import tools
from diagnosis.agent.react import _validate
from diagnosis.agent.react_tools import tool_args
from diagnosis.consequences import plain_words
from diagnosis.decisions import ActionError
from diagnosis.eventlog import registry
from diagnosis.selfcheck import publish_check
from diagnosis.templatetags.timeline import argument_label
from diagnosis.wording import done_words, enrichment_warning, failure_words
from scenarios_admin.definition import (
    below_floor,
    restriction_of,
    risk_floor,
    shown_as_decision,
)
from tests import neutral_pack


@pytest.fixture
def neutral() -> Iterator[packs.DomainPack]:
    with neutral_pack.installed(neutral_pack.pack()) as pack:
        yield pack


def test_the_pack_is_chosen_by_its_kind_and_its_action_by_its_name(
    neutral: packs.DomainPack,
) -> None:
    assert packs.pack_for("neutral") is neutral
    assert packs.action_tool("restart_host") is neutral_pack.ACTION
    assert packs.action_args("restart_host") == ("host",)
    assert packs.actions_of("neutral") == {"restart_host": neutral_pack.ACTION}
    assert "host" in packs.target_args()


def test_policy_and_board_read_the_declaration(neutral: packs.DomainPack) -> None:
    assert risk_floor("restart_host") == "R2"
    assert below_floor("restart_host", "R1") and not below_floor("restart_host", "R3")
    assert restriction_of("restart_host", {"host": "h1"}) is None  # it restricts nothing
    assert packs.restricting_action("host") is None
    assert shown_as_decision("restart_host") and not shown_as_decision("lookup_host")


def test_words_come_from_the_pack(neutral: packs.DomainPack) -> None:
    with translation.override("en"):
        assert plain_words("restart_host", {"host": "h1"}) == "Restart h1"
        assert tools.dispatch_summary("restart_host", {"host": "h1"}) == "Host restarted (host h1)"
        assert done_words("restart_host", {"host": "h1"}, {"summary": "x"}) == (
            "Host restarted (host h1)"
        )
        assert argument_label("host") == "host"
        logged = tools.failure("no_host", host="h9")
        assert logged == "host h9 is unknown" and failure_words(logged) == logged
        assert enrichment_warning({"host": {"up": False}}) == "the host is down"
        assert enrichment_warning({"host": {"up": True}}) == ""


def test_an_approvers_edit_is_checked_by_the_pack(neutral: packs.DomainPack) -> None:
    assert checked_args("restart_host", {"host": "h1"}, {"host": "h2"}) == {"host": "h2"}
    with pytest.raises(ActionError, match="not a host"):
        checked_args("restart_host", {"host": "h1"}, {"host": "x"})
    assert Approval(action_name="restart_host").editable_args == ["host"]


def test_the_model_may_pick_the_packs_tools_with_their_arguments_checked(
    neutral: packs.DomainPack,
) -> None:
    known = tool_args()
    assert known["lookup_host"] == (neutral_pack.HostArgs, "Is a host up.")
    assert known["restart_host"][0] is neutral_pack.HostArgs
    valid, problems = _validate(
        [
            {"name": "lookup_host", "args": {"host": "h1"}},
            {"name": "restart_host", "args": {"hostname": "h1"}},
        ]
    )
    assert [c["name"] for c in valid] == ["lookup_host"]
    assert problems[0]["name"] == "restart_host" and problems[0]["repairable"]


def test_the_lookup_is_an_enrichment_source_and_the_finding_a_kind(
    neutral: packs.DomainPack,
) -> None:
    assert tools.ENRICHMENT_SOURCES["lookup_host"]({"host": "down-1"}) == {
        "host": "down-1",
        "up": False,
    }
    assert tools.ENRICHMENT_KEYS["lookup_host"] == "host"
    assert neutral_pack.lookup_host in tools.IN_PROCESS_SOURCES
    kind = registry.finding_kind("host_note")
    assert kind is neutral_pack.FINDING
    assert kind.summary is not None and kind.summary({"text": "h1 slow"}) == "note: h1 slow"


def test_a_scenario_whose_pack_runs_no_example_cases_is_not_published(
    neutral: packs.DomainPack,
) -> None:
    """Publishing fails closed: a pack that runs no example cases gets no scenario
    published as if its cases had passed."""
    definition = {"kind": neutral_pack.KIND, "actions": [], "examples": [{"text": "h1 slow"}]}
    assert publish_check(None, definition) == [
        "the example cases cannot run: no installed pack checks kind 'neutral'"
    ]


def test_nothing_is_left_installed_after_a_test() -> None:
    assert "neutral" not in {p.kind for p in packs.installed_packs()}
    assert packs.action_tool("restart_host") is None
    assert "lookup_host" not in tools.ENRICHMENT_SOURCES
