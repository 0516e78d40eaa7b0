"""Replay pages: the step player, filters, payloads, masking, keyset pages.

Personas: alice operates, bob approves, carol audits (read-only), dave has no role,
root is a superuser."""

from __future__ import annotations

import hashlib
import html
import io
import random
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import markdown
import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from pytest_django import DjangoAssertNumQueries, Settings

from aero.models import AuditLog
from aero.roles import ensure_role_groups
from approvals.actions import do_decide
from diagnosis.actions import do_delete_session
from diagnosis.agent_tree import read_tree
from diagnosis.chain import verify_chain
from diagnosis.events import append_event
from diagnosis.models import AgentRun, Event, Report, Session
from replay import export as export_module
from replay import history as history_module
from replay import jobs, presenters
from replay.forms import EVENT_GROUPS
from replay.models import SessionSearch
from scenarios_admin.builtin import load_builtin_data
from tests.web_helpers import (
    NO_POSITION,
    STAND_FUEL_LEAK,
    TAXIWAY_FUEL_LEAK,
    approval_for,
    approve_everything,
    login,
    login_url,
    make_session,
)

# Each test runs in a transaction rolled back after it; the module's sessions are
# committed once, before (see `world`).
pytestmark = [pytest.mark.services, pytest.mark.django_db]


@pytest.fixture(scope="module")
def world(django_db_setup: None, django_db_blocker: Any) -> Iterator[dict[str, Any]]:
    """Sessions run once for the whole module (an agent run takes seconds); the tests only
    read them. Flushed at the end like a transactional test would be."""
    with django_db_blocker.unblock():
        load_builtin_data()
        ensure_role_groups()
        people = {
            name: make_person(name, *roles)
            for name, roles in {
                "alice": ["operator"],
                "bob": ["approver"],
                "carol": ["auditor"],
                "dave": [],
            }.items()
        }
        people["root"] = User.objects.create_superuser("root", password="pw-for-tests")
        session = make_session(people["alice"], STAND_FUEL_LEAK)
        standby = approval_for(session, "request_fire_standby")
        do_decide(
            standby.pk, people["bob"], "reject", "no [x](javascript:1) | ok", digest=standby.digest
        )
        approve_everything(session, people["bob"])
        assert session.status == "completed"
        long = make_session(people["alice"], NO_POSITION)
        for i in range(300):
            append_event(long.pk, "agent.note", {"text": f"note {i}"}, producer="test")
        long.refresh_from_db()
        taxiway = make_session(people["alice"], TAXIWAY_FUEL_LEAK)
        yield {**people, "finished": session, "long": long, "taxiway": taxiway}
        call_command("flush", interactive=False, verbosity=0)


def make_person(name: str, *roles: str) -> User:
    user = User.objects.create_user(username=name, password="pw-for-tests")
    user.groups.add(*Group.objects.filter(name__in=roles))
    return user


@pytest.fixture
def finished(world: dict[str, Any]) -> Session:
    return world["finished"]


@pytest.fixture
def alice(world: dict[str, Any]) -> User:
    return world["alice"]


@pytest.fixture
def bob(world: dict[str, Any]) -> User:
    return world["bob"]


@pytest.fixture
def carol(world: dict[str, Any]) -> User:
    return world["carol"]


@pytest.fixture
def dave(world: dict[str, Any]) -> User:
    return world["dave"]


@pytest.fixture
def root(world: dict[str, Any]) -> User:
    return world["root"]


def step(client: Client, session: Session, **params: Any) -> Any:
    return client.get(reverse("replay:replay-step", args=[session.pk]), params)


def seq_of(session: Session, type: str, nth: int = 0, **payload: str) -> int:
    """The seq of the nth event of `type` (whose payload holds `payload`: a finding's kind)."""
    return list(
        Event.objects.filter(
            session=session, type=type, **{f"payload__{k}": v for k, v in payload.items()}
        )
        .order_by("seq")
        .values_list("seq", flat=True)
    )[nth]


# --- access -----------------------------------------------------------------------------

SESSION_URLS = ["replay-step", "replay-event", "replay-export"]


def session_url(name: str, session_id: uuid.UUID) -> str:
    args: list[Any] = [session_id, 1] if name == "replay-event" else [session_id]
    return reverse(f"replay:{name}", args=args)


@pytest.mark.parametrize("name", SESSION_URLS)
def test_anonymous_users_go_to_the_login_page(name: str, finished: Session) -> None:
    url = session_url(name, finished.pk)
    response = Client().post(url) if name == "replay-export" else Client().get(url)
    assert response.status_code == 302
    assert response["Location"] == login_url(url)


@pytest.mark.parametrize("name", SESSION_URLS)
def test_users_without_a_role_are_refused(name: str, finished: Session, dave: User) -> None:
    url = session_url(name, finished.pk)
    client = login(dave)
    response = client.post(url) if name == "replay-export" else client.get(url)
    assert response.status_code == 403


@pytest.mark.parametrize("name", SESSION_URLS)
def test_unknown_sessions_are_404(name: str, carol: User) -> None:
    url = session_url(name, uuid.uuid4())
    client = login(carol)
    response = client.post(url) if name == "replay-export" else client.get(url)
    assert response.status_code == 404


def test_every_viewing_role_may_replay(finished: Session) -> None:
    for role in ("operator", "approver", "auditor", "admin"):
        user = User.objects.get_or_create(username=f"viewer-{role}")[0]
        user.groups.set(Group.objects.filter(name=role))
        assert step(login(user), finished).status_code == 200, role


def test_the_live_page_and_the_nav_link_to_replay_and_history(
    finished: Session, alice: User
) -> None:
    page = login(alice).get(reverse("diagnosis:session-detail", args=[finished.pk]))
    html_text = page.content.decode()
    assert reverse("replay:replay-step", args=[finished.pk]) in html_text
    assert f'href="{reverse("replay:history")}"' in html_text


def test_the_export_refuses_get(finished: Session, carol: User) -> None:
    url = reverse("replay:replay-export", args=[finished.pk])
    assert login(carol).get(url).status_code == 405


# --- the player ---------------------------------------------------------------------------


def test_the_first_step_shows_the_session_as_it_began(finished: Session, carol: User) -> None:
    response = step(login(carol), finished)
    page = response.content.decode()
    assert response.context["seq"] == 1
    assert response.context["state"].status == "queued"
    assert 'data-testid="risk"' not in page  # not assessed yet
    assert "No actions by this step." in page
    assert 'rel="next"' in page and 'rel="prev"' not in page


def test_a_middle_step_shows_the_state_then_not_now(finished: Session, bob: User) -> None:
    risk_seq = seq_of(finished, "finding.recorded", kind="risk")
    before = step(login(bob), finished, seq=risk_seq - 1)
    assert before.context["state"].risk is None
    at = step(login(bob), finished, seq=risk_seq)
    page = at.content.decode()
    assert at.context["state"].risk["rule"] == "OS-01"
    assert "OS-01" in page and "HIGH" in page
    assert 'data-field="flight_no">CA1234' in page
    assert "“<bdi>CA1234</bdi>”" in page  # evidence for the field
    # The reader's language (English here) for the Chinese session's labels, and the
    # rule's conditions in words with their codes in the tooltips.
    assert "<th>Flight number" in page and "航班号" not in page
    risk = page[page.index('<p class="risk risk-high" data-testid="risk">') :]
    risk = risk[: risk.index("</p>")]
    assert '<span title="fluid_type=FUEL">Fluid type: Fuel</span>' in risk
    assert ">fluid_type=FUEL" not in risk and "(fluid_type" not in risk
    # The actions come later: none at this step, though the session has them now.
    assert "No actions by this step." in page


def test_the_last_step_shows_decisions_with_who_when_and_reason(
    finished: Session, bob: User
) -> None:
    response = step(login(bob), finished, seq=finished.last_seq)
    page = response.content.decode()
    assert response.context["state"].status == "completed"
    actions = page[page.index('id="replay-actions"') : page.index('id="replay-evidence"')]
    assert "rejected by <strong>bob</strong>" in actions
    # The reason is text, escaped by the template: no link is made of it.
    assert "no [x](javascript:1) | ok" in actions
    assert "<a " not in actions
    assert "approved by <strong>bob</strong>" in actions
    # Each step of a two-step approval in words; the code stays in the tooltip.
    assert "approved once (1 of 2) by <strong>bob</strong>" in actions
    assert '<div class="decision" title="first_approved">approved once' in actions
    assert ">first_approved" not in actions
    assert 'id="replay-report"' in page
    assert response.context["nav"]["next"] is None


def test_next_and_previous_follow_the_type_filter(finished: Session, carol: User) -> None:
    approvals = list(
        Event.objects.filter(session=finished, type__startswith="approval.")
        .order_by("seq")
        .values_list("seq", flat=True)
    )
    response = step(login(carol), finished, seq=approvals[1], groups="approvals")
    nav = response.context["nav"]
    assert (nav["previous"], nav["next"]) == (approvals[0], approvals[2])
    assert (nav["first"], nav["last"]) == (approvals[0], approvals[-1])
    listed = {e.type for e in response.context["events"]}
    assert listed and all(t.startswith("approval.") for t in listed)
    # The links keep the filter, so the next click stays in it.
    assert f"groups=approvals&amp;seq={approvals[2]}" in response.content.decode()


def test_jump_to_a_time_finds_the_last_step_before_it(finished: Session, carol: User) -> None:
    risk_seq = seq_of(finished, "finding.recorded", kind="risk")
    target = Event.objects.get(session=finished, seq=risk_seq)
    at = timezone.localtime(target.ts).replace(microsecond=0, tzinfo=None)
    response = step(login(carol), finished, at=at.isoformat())
    assert response.context["seq"] <= target.seq
    assert response.context["current"].ts <= target.ts.replace(microsecond=999999)


def test_the_time_range_filter_selects_steps(finished: Session, carol: User) -> None:
    later = timezone.now() + timedelta(days=1)
    response = step(login(carol), finished, since=later.strftime("%Y-%m-%dT%H:%M"))
    assert response.context["events"] == []
    assert "No events match these filters." in response.content.decode()


def test_the_run_subtree_filter(finished: Session, carol: User) -> None:
    root = AgentRun.objects.filter(session=finished, parent__isnull=True).order_by("pk").first()
    assert root is not None
    subtree = set(presenters.run_subtree(read_tree(finished.pk), finished, root.pk))
    assert len(subtree) > 1  # the job's run and its node runs
    response = step(login(carol), finished, run=root.pk, seq=1)
    events = response.context["events"]
    assert events and all(e.run_id in subtree for e in events)
    page = response.content.decode()
    # the run tree is shown, each run by its words (its name in the tooltip)
    assert f'title="incident_agent #{root.pk}">incident agent #{root.pk}<' in page
    assert ">reading the message #" in page  # with the selected root's node runs


def test_bad_input_is_a_clear_error(finished: Session, carol: User) -> None:
    client = login(carol)
    response = step(client, finished, seq=finished.last_seq + 5)
    assert response.status_code == 400
    assert f"This session has {finished.last_seq} events." in response.content.decode()
    assert step(client, finished, seq="abc").status_code == 400
    assert step(client, finished, groups="nope").status_code == 400
    response = step(client, finished, since="2026-01-02T00:00", until="2026-01-01T00:00")
    assert "before its start" in response.content.decode()


def test_play_refreshes_to_the_next_step(finished: Session, carol: User) -> None:
    response = step(login(carol), finished, seq=3, play="2")
    page = response.content.decode()
    next_seq = response.context["nav"]["next"]
    # htmx fetches the next step after the delay; without JavaScript the page refreshes.
    assert 'hx-trigger="load delay:500ms"' in page
    assert (
        f'<noscript><meta http-equiv="refresh" content="1;url=?seq={next_seq}&amp;play=2">' in page
    )
    assert 'data-testid="pause"' in page
    last = step(login(carol), finished, seq=finished.last_seq, play="2")
    assert 'data-testid="autoplay"' not in last.content.decode()


def test_htmx_requests_get_the_player_fragment(finished: Session, carol: User) -> None:
    response = login(carol).get(
        reverse("replay:replay-step", args=[finished.pk]), {"seq": 5}, HTTP_HX_REQUEST="true"
    )
    page = response.content.decode()
    assert page.lstrip().startswith('<div id="replay-body"')
    assert "<html" not in page


def test_a_deleted_session_still_replays_marked_deleted(
    finished: Session, carol: User, root: User
) -> None:
    do_delete_session(finished.pk, root, "duplicate")  # rolled back after the test
    response = step(login(carol), finished)
    assert response.status_code == 200
    page = response.content.decode()
    assert 'data-testid="deleted"' in page and "by root" in page
    last = step(login(carol), finished, seq=finished.last_seq + 1)
    assert last.context["current"].type == "session.deleted"


# --- the hash chain -------------------------------------------------------------------------


def test_the_replay_page_shows_the_verified_chain(finished: Session, carol: User) -> None:
    page = step(login(carol), finished).content.decode()
    head = verify_chain(finished.pk).head
    assert f'<code data-testid="chain-head">{head}</code>' in page
    assert "Hash chain verified" in page


def test_an_edited_event_shows_as_a_broken_chain(finished: Session, carol: User) -> None:
    seq = seq_of(finished, "finding.recorded", kind="risk")
    with connection.cursor() as cursor:  # rolled back after the test
        cursor.execute(
            "UPDATE diagnosis_event SET payload = jsonb_set(payload, '{level}', '\"LOW\"') "
            "WHERE session_id = %s AND seq = %s",
            [finished.pk, seq],
        )
    page = step(login(carol), finished).content.decode()
    assert f"Hash chain broken at seq {seq}" in page
    text = export(login(carol), finished).content.decode()
    assert "**The chain does not verify**" in text and f"first bad seq {seq}" in text


def test_a_long_log_verifies_its_chain_on_its_own_request(
    finished: Session, carol: User, dave: User, settings: Settings
) -> None:
    settings.AERO_REPLAY_CHAIN_INLINE_EVENTS = 10
    page = step(login(carol), finished).content.decode()
    chain_url = reverse("replay:replay-chain", args=[finished.pk])
    assert f'hx-get="{chain_url}" hx-trigger="load"' in page and "chain-head" not in page
    fragment = login(carol).get(chain_url, HTTP_HX_REQUEST="true").content.decode()
    assert fragment.startswith('<div id="chain-state"') and "Hash chain verified" in fragment
    assert Client().get(chain_url).status_code == 302
    assert login(dave).get(chain_url).status_code == 403
    unknown = reverse("replay:replay-chain", args=[uuid.uuid4()])
    assert login(carol).get(unknown).status_code == 404


# --- payloads and masking -----------------------------------------------------------------


def payload(client: Client, session: Session, seq: int, **headers: Any) -> Any:
    return client.get(reverse("replay:replay-event", args=[session.pk, seq]), **headers)


def test_the_full_original_payload_on_demand(finished: Session, alice: User) -> None:
    seq = seq_of(finished, "tool.call_completed")
    response = payload(login(alice), finished, seq)
    page = response.content.decode()
    assert "lookup_aircraft_info" in page and "B-6543" in page  # the full response
    fragment = payload(login(alice), finished, seq, HTTP_HX_REQUEST="true").content.decode()
    assert "B-6543" in fragment and "<html" not in fragment
    assert payload(login(alice), finished, finished.last_seq + 1).status_code == 404


def test_auditors_see_high_risk_payloads_masked(finished: Session, carol: User) -> None:
    closing = Event.objects.get(
        session=finished,
        type="tool.call_completed",
        payload__tool_name="close_taxiway",
        payload__args__taxiway="A",
    )
    page = html.unescape(payload(login(carol), finished, closing.seq).content.decode())
    assert '"args": "masked"' in page and '"response": "masked"' in page
    assert "Masked for your role: args, response, call_id." in page
    assert "Taxiway closed: A" not in page
    assert '"tool_name": "close_taxiway"' in page  # masked, never dropped
    # A low-risk payload is shown in full.
    lookup = seq_of(finished, "tool.call_completed")
    assert "B-6543" in payload(login(carol), finished, lookup).content.decode()


def test_what_an_edit_or_a_correction_changed_is_masked_like_the_action() -> None:
    """The arguments a closure had before an approver's edit, or before a correction
    changed them, are as closed to an auditor as the arguments it has now."""
    from diagnosis.eventlog.masking import masked_keys

    closure = {"tool_name": "close_taxiway", "risk_level": "R2"}
    edited = {**closure, "before": {"taxiway": "A"}, "args": {"taxiway": "B"}}
    assert masked_keys("approval.args_edited", edited) == ["args", "before"]
    again = {**edited, "kind": "proposed_again"}
    assert masked_keys("agent.note", again) == ["args", "before"]
    notice = {"tool_name": "notify_atc", "risk_level": "R0", "before": {"message": "m"}}
    assert masked_keys("agent.note", {**notice, "args": {"message": "n"}}) == []


def test_admins_and_operators_see_everything(finished: Session, root: User, alice: User) -> None:
    closing = Event.objects.get(
        session=finished,
        type="tool.call_completed",
        payload__tool_name="close_taxiway",
        payload__args__taxiway="A",
    )
    for user in (root, alice):
        page = payload(login(user), finished, closing.seq).content.decode()
        assert "Taxiway closed: A" in page and "masked" not in page


def test_the_state_panels_mask_like_the_events(finished: Session, carol: User, root: User) -> None:
    audited = step(login(carol), finished, seq=finished.last_seq).content.decode()
    assert '<span class="masked">masked</span>' in audited
    assert "Taxiway closed: A" not in audited
    assert "Fire and rescue" not in audited or "R1" in audited  # R1 results stay visible
    closing = Event.objects.get(
        session=finished,
        type="tool.call_completed",
        payload__tool_name="close_taxiway",
        payload__args__taxiway="A",
    )
    at_closing = step(login(carol), finished, seq=closing.seq).content.decode()
    assert "Taxiway closed: A" not in at_closing  # nor in the current step's summary
    assert "Taxiway closed: A" in step(login(root), finished, seq=closing.seq).content.decode()
    full = step(login(root), finished, seq=finished.last_seq).content.decode()
    assert "Taxiway closed: A" in full and '<span class="masked">' not in full


def test_the_mask_policy_is_a_setting(finished: Session, carol: User, settings: Settings) -> None:
    settings.AERO_REPLAY_MASK = [{"types": ["user.message"], "fields": ["text"]}]
    seq = seq_of(finished, "user.message")
    page = html.unescape(payload(login(carol), finished, seq).content.decode())
    assert '"text": "masked"' in page
    closing = Event.objects.get(
        session=finished,
        type="tool.call_completed",
        payload__tool_name="close_taxiway",
        payload__args__taxiway="A",
    )
    assert "Taxiway closed: A" in payload(login(carol), finished, closing.seq).content.decode()


def test_a_bad_mask_policy_fails_the_system_check(settings: Settings) -> None:
    from replay.apps import check_mask_policy

    settings.AERO_REPLAY_MASK = [{"types": "tool.*"}]
    assert [e.id for e in check_mask_policy()] == ["replay.E001"]


# --- long sessions --------------------------------------------------------------------------


def test_the_step_page_query_count_does_not_grow_with_the_log(
    world: dict[str, Any], carol: User, django_assert_max_num_queries: DjangoAssertNumQueries
) -> None:
    session = world["long"]
    client = login(carol)
    step(client, session, seq=2)  # warm the session's caches (roles, graph)
    with django_assert_max_num_queries(15):  # 2 verify the chain
        response = step(client, session, seq=session.last_seq - 10)
    assert response.status_code == 200
    # LIST_BEFORE before the step, the step and the 10 after it.
    assert len(response.context["events"]) == presenters.LIST_BEFORE + 11


def test_checkpoints_give_the_same_state_as_a_full_fold(
    finished: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At random seqs, the step's state (cached checkpoint + the events after it) is the
    whole fold of events[:seq], field for field: status, snapshot, tool calls, approvals
    with every decision, messages, report, tokens and cost."""
    from diagnosis.fold import fold_events

    monkeypatch.setattr(presenters, "CHECKPOINT_EVERY", 7)
    monkeypatch.setattr(presenters, "_CHECKPOINT_VERSION", uuid.uuid4().hex)
    session = finished
    events = list(Event.objects.filter(session=session).order_by("seq"))
    rng = random.Random(9)
    seqs = rng.sample(range(1, session.last_seq + 1), k=min(30, session.last_seq))
    # First visits lay checkpoints down; the second round reads them back.
    for seq in [*seqs, session.last_seq, *seqs]:
        assert presenters.state_at(session, seq) == fold_events(events[:seq]), seq


def test_a_group_filter_steps_to_the_same_neighbours_as_a_full_scan(finished: Session) -> None:
    """Each selected type walks its own index run (ordered()); the neighbours, ends and
    event list must be those of a plain scan of the whole log."""
    events = list(Event.objects.filter(session=finished).order_by("seq"))
    for groups in (["approvals"], ["llm", "approvals"], ["session"]):
        prefixes = tuple(p for g in groups for p in EVENT_GROUPS[g][1])
        chosen = [e.seq for e in events if e.type.startswith(prefixes)]
        assert chosen, groups
        filters = presenters.Filters(groups=groups)
        for seq in (
            1,
            chosen[0],
            chosen[len(chosen) // 2],
            finished.last_seq // 2,
            finished.last_seq,
        ):
            assert presenters.navigation(finished, filters, seq) == {
                "first": chosen[0],
                "previous": max((c for c in chosen if c < seq), default=None),
                "next": min((c for c in chosen if c > seq), default=None),
                "last": chosen[-1],
            }, (groups, seq)
            window, _, _ = presenters.event_window(finished, filters, seq, None, None)
            before = [c for c in chosen if c < seq][-presenters.LIST_BEFORE :]
            after = [c for c in chosen if c >= seq][: presenters.LIST_AFTER]
            assert [e.seq for e in window] == before + after, (groups, seq)


# --- export ---------------------------------------------------------------------------------


def row_of(*cells: str) -> str:
    """Consecutive cells of a table row as Python-Markdown renders them."""
    return "\n".join(f"<td>{cell}</td>" for cell in cells)


def export(client: Client, session: Session) -> Any:
    return client.post(reverse("replay:replay-export", args=[session.pk]))


def test_a_small_export_downloads_at_once_and_is_audited(finished: Session, root: User) -> None:
    response = export(login(root), finished)
    assert response.status_code == 200
    assert response["Content-Type"] == "text/markdown; charset=utf-8"
    assert f"aero-session-{finished.pk}.md" in response["Content-Disposition"]
    text = response.content.decode()
    for heading in (
        "## 1. Session",
        "## 2. Conclusion",
        "## 3. Evidence chain",
        "## 4. Approval record",
        "## 5. Tokens and cost",
        "## 6. Agent tree",
        "## 7. Recommended follow-ups",
        "## 8. Chronology",
    ):
        assert heading in text
    page = markdown.markdown(text, extensions=["tables"])
    assert "Risk <strong>HIGH</strong> (score 95) by rule OS-01" in page
    assert row_of("close_taxiway", "R2", "taxiway=A", "approved", "bob") in page
    assert "request_fire_standby was rejected" in page  # a follow-up
    assert f"| {finished.last_seq} |" in text  # the chronology reaches the last event
    head = verify_chain(finished.pk).head
    assert f"Chain head: `{head}`" in text and "## 9. Hash chain" in text
    entry = AuditLog.objects.get(action="session.exported", session_id=finished.pk)
    assert entry.actor == root
    assert entry.detail["sha256"] == hashlib.sha256(response.content).hexdigest()
    assert entry.detail["mode"] == "direct" and entry.detail["masked"] is False


def test_user_text_cannot_inject_links_or_break_tables(finished: Session, root: User) -> None:
    text = export(login(root), finished).content.decode()
    row = next(
        line
        for line in text.splitlines()
        if line.startswith("| request") and "| rejected |" in line
    )
    assert "\\[x\\]" in row and "\\|" in row  # escaped, whatever the helper
    html_text = markdown.markdown(text, extensions=["tables"])
    assert 'href="javascript' not in html_text
    # The row keeps its 7 cells: the `|` in the reason did not split one.
    rejected = next(
        r for r in html_text.split("<tr>") if "<td>rejected</td>" in r and "javascript" in r
    )
    assert rejected.count("<td>") == 7


def test_an_auditors_export_is_masked(finished: Session, carol: User) -> None:
    text = export(login(carol), finished).content.decode()
    page = markdown.markdown(text, extensions=["tables"])
    assert row_of("close_taxiway", "R2", "masked", "approved", "bob") in page
    assert "Taxiway closed: A" not in text
    assert "high-risk payloads masked" in page
    assert AuditLog.objects.get(action="session.exported", actor=carol).detail["masked"] is True


def test_a_large_export_runs_in_the_background_with_progress(
    finished: Session,
    carol: User,
    settings: Settings,
    django_capture_on_commit_callbacks: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings.AERO_REPLAY_EXPORT_INLINE_EVENTS = 10
    client = login(carol)
    seen: list[tuple[int, int]] = []
    real_progress = export_module.PROGRESS_EVERY
    monkeypatch.setattr(export_module, "PROGRESS_EVERY", 50)
    original = jobs._save

    def spy(job: jobs.ExportJob) -> None:
        seen.append((job.done, job.total))
        original(job)

    monkeypatch.setattr(jobs, "_save", spy)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = export(client, finished)
    assert response.status_code == 302
    status_url = response["Location"]
    queued = client.get(status_url)
    assert (
        "0 of" in queued.content.decode()
        and 'hx-trigger="load delay:1s"' in queued.content.decode()
    )
    for callback in callbacks:
        callback()  # the inline backend runs the job here
    assert real_progress == 1000
    assert len([s for s in seen if 0 < s[0] < finished.last_seq]) >= 2  # progress moved
    done = client.get(status_url).content.decode()
    assert 'data-testid="download"' in done
    assert not AuditLog.objects.filter(action="session.exported").exists()  # not yet out
    download = client.get(status_url + "download/")
    assert download.status_code == 200 and b"## 8. Chronology" in download.content
    entry = AuditLog.objects.get(action="session.exported", actor=carol)
    assert entry.detail["mode"] == "background"
    # Someone else's export is not there for them.
    assert login(User.objects.get(username="bob")).get(status_url).status_code == 404


def test_export_status_access(carol: User, dave: User) -> None:
    url = reverse("replay:export-status", args=["0" * 32])
    assert Client().get(url).status_code == 302
    assert login(dave).get(url).status_code == 403
    assert login(carol).get(url).status_code == 404
    download = reverse("replay:export-download", args=["0" * 32])
    assert Client().get(download).status_code == 302
    assert login(dave).get(download).status_code == 403
    assert login(carol).get(download).status_code == 404


# --- history --------------------------------------------------------------------------------


def history(client: Client, **params: Any) -> Any:
    return client.get(reverse("replay:history"), params)


def found(response: Any) -> list[Session]:
    return [row["session"] for row in response.context["rows"]]


def test_history_access(carol: User, dave: User) -> None:
    url = reverse("replay:history")
    assert Client().get(url)["Location"] == login_url(url)
    assert login(dave).get(url).status_code == 403
    assert login(carol).get(url).status_code == 200


def test_history_filters(world: dict[str, Any], carol: User) -> None:
    client = login(carol)
    finished, long, taxiway = world["finished"], world["long"], world["taxiway"]
    assert set(found(history(client))) == {finished, long, taxiway}
    assert found(history(client, flight="mu5678")) == [taxiway]
    assert set(found(history(client, flight="CA1234"))) == {finished, long}
    assert found(history(client, position="105")) == [finished]
    assert found(history(client, status="completed")) == [finished]
    assert found(history(client, risk="HIGH", flight="CA1234")) == [finished]
    assert found(history(client, scenario="bird_strike")) == []
    assert set(found(history(client, creator="alice"))) == {finished, long, taxiway}
    today = timezone.localdate()
    assert len(found(history(client, since=today.isoformat(), until=today.isoformat()))) == 3
    assert found(history(client, until=(today - timedelta(days=1)).isoformat())) == []
    page = history(client, flight="MU5678").content.decode()
    # The scenario filter's empty choice reads like the others' ("any").
    scenarios = page[page.index('<select name="scenario"') :]
    scenarios = scenarios[: scenarios.index("</select>")]
    assert '<option value="" selected>any</option>' in scenarios
    assert reverse("replay:replay-step", args=[taxiway.pk]) in page
    assert reverse("diagnosis:session-detail", args=[taxiway.pk]) in page


def test_history_free_text_matches_chinese_answers_and_reports(
    world: dict[str, Any], carol: User
) -> None:
    client = login(carol)
    assert found(history(client, q="发动机仍在运转")) == [world["finished"]]  # inside a word
    assert found(history(client, q="滑行道C1")) == [world["taxiway"]]
    assert found(history(client, q="fuel leak")) == [world["long"]]
    assert found(history(client, q="leaking")) == [world["long"]]  # full text: stemmed
    report_word = Report.objects.get(session=world["finished"]).markdown.split()[1]
    assert world["finished"] in found(history(client, q=report_word))
    assert found(history(client, q="%")) == []  # LIKE wildcards are text


def test_the_search_document_is_the_logs_text_kept_as_events_arrive(
    world: dict[str, Any], carol: User
) -> None:
    """The trigger keeps one document per session in the events' own transaction; it is
    what a rebuild from the log gives, and it holds the opening message, the answers and
    the report."""
    finished = world["finished"]
    kept = dict(SessionSearch.objects.values_list("session_id", "document"))
    texts = [
        e.payload.get("markdown") if e.type == "report.ready" else e.payload.get("text")
        for e in Event.objects.filter(
            session=finished, type__in=["user.message", "report.ready"]
        ).order_by("seq")
    ]
    assert kept[finished.pk] == "\n".join(texts)
    assert Report.objects.get(session=finished).markdown in kept[finished.pk]
    SessionSearch.objects.all().delete()  # rolled back with the test
    assert history_module.rebuild_documents() == len(kept)
    assert dict(SessionSearch.objects.values_list("session_id", "document")) == kept
    SessionSearch.objects.filter(pk=finished.pk).update(document="stale")
    out = io.StringIO()
    call_command("rebuild_search", stdout=out)
    assert out.getvalue() == f"rebuilt {len(kept)} search documents from the event log\n"
    assert dict(SessionSearch.objects.values_list("session_id", "document")) == kept

    # A new answer is searchable as soon as its event is written (same transaction).
    append_event(
        world["taxiway"].pk,
        "user.message",
        {"text": "泡沫覆盖已完成", "author": "alice"},
        producer="test",
    )
    assert found(history(login(carol), q="泡沫覆盖")) == [world["taxiway"]]


def test_a_history_page_reads_its_rows_in_one_query(
    world: dict[str, Any], django_assert_num_queries: DjangoAssertNumQueries
) -> None:
    """The page and the API (api/history.py) show these per row: loading only the row's
    columns must not turn any of them into a query per row."""
    with django_assert_num_queries(1):
        rows = history_module.search({}).rows
        shown = [
            (
                r["session"].title,
                r["session"].status,
                r["session"].created_at,
                r["session"].updated_at,
                r["session"].scenario.slug,
                r["session"].scenario.name_en,
                r["session"].created_by.get_username(),
                r["columns"]["flight"],
                r["columns"]["position"],
                r["risk"],
            )
            for r in rows
        ]
    assert len(shown) == 3
    assert {row[7] for row in shown} == {"CA1234", "MU5678"}


def test_history_excludes_deleted_sessions(world: dict[str, Any], carol: User) -> None:
    Session.objects.filter(pk=world["long"].pk).update(deleted_at=timezone.now())  # rolled back
    assert world["long"] not in found(history(login(carol)))


def test_history_keyset_pages_and_sorting(
    world: dict[str, Any], carol: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    from replay import history as history_module

    monkeypatch.setattr(history_module, "PAGE", 2)
    client = login(carol)
    first = history(client)
    assert found(first) == [world["taxiway"], world["long"]]
    cursor = first.context["next_link"]
    assert cursor
    second = client.get(reverse("replay:history") + cursor)
    assert found(second) == [world["finished"]] and not second.context["next_link"]
    oldest = history(client, sort="created")
    assert found(oldest) == [world["finished"], world["long"]]
    assert history(client, cursor="garbage").status_code == 400
    assert history(client, creator="nobody").status_code == 400


def test_history_query_count(
    world: dict[str, Any], carol: User, django_assert_max_num_queries: DjangoAssertNumQueries
) -> None:
    client = login(carol)
    history(client)
    # 7: an auditor's text search reads the found sessions' hidden values (one query), so
    # a value the masking hides finds nothing.
    with django_assert_max_num_queries(7):
        response = history(client, q="燃油", risk="HIGH")
    assert response.status_code == 200
