"""Access, as a table: every URL pattern the resolver knows and every WebSocket route,
requested as anonymous, operator, approver, auditor and admin, with the exact outcome.

A new URL pattern or WebSocket route without a row here fails
`test_every_url_pattern_has_a_row` / `test_every_websocket_route_has_a_row`.

Outcomes: a status code, LOGIN (302 to the sign-in page with ?next=), ADMIN_LOGIN (302
to the admin's sign-in page). Admin pages for non-staff users always go to ADMIN_LOGIN;
for the admin (a superuser) the expected code comes from ADMIN_PAGES, by the page's kind.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.contrib.contenttypes.models import ContentType
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from api.models import ApiToken
from approvals.models import ManualTodo
from diagnosis.models import Report, ToolCall
from ingest.models import GateSettings
from packs.airport.models import Restriction
from scenarios_admin.models import ProviderConfig
from tests.web_helpers import approval_for, waiting_session
from tools.models import McpServer, Skill

pytestmark = pytest.mark.services

PERSONAS = ("anonymous", "operator", "approver", "auditor", "admin")
LOGIN = "login"
ADMIN_LOGIN = "admin-login"

# name: (method, {persona: outcome}); one outcome for all personas is written once.
ANON, OP, APP, AUD, ADM = PERSONAS


def row(anonymous: Any, operator: Any, approver: Any, auditor: Any, admin: Any) -> dict[str, Any]:
    return dict(zip(PERSONAS, (anonymous, operator, approver, auditor, admin), strict=True))


URLS: dict[str, tuple[str, dict[str, Any]]] = {
    "home": ("GET", row(302, 302, 302, 302, 302)),  # to /sessions/
    "healthz": ("GET", row(200, 200, 200, 200, 200)),
    "login": ("GET", row(200, 200, 200, 200, 200)),
    "logout": ("POST", row(302, 302, 302, 302, 302)),
    # the language switch is for everyone (the sign-in page has it); no language: 400
    "set-language": ("POST", row(400, 400, 400, 400, 400)),
    "audit": ("GET", row(LOGIN, 403, 403, 200, 200)),
    "audit-csv": ("GET", row(LOGIN, 403, 403, 200, 200)),
    "diagnosis:session-list": ("GET", row(LOGIN, 200, 200, 200, 200)),
    "diagnosis:session-create": ("POST", row(LOGIN, 400, 403, 403, 400)),  # empty form: errors
    # the new-incident form's scenario select, re-rendered as the operator types
    "diagnosis:session-suggest": ("GET", row(LOGIN, 200, 403, 403, 200)),
    # the IT diagnosis form: an empty form (no bundle, no demo) is an error
    "diagnosis_pack:new": ("POST", row(LOGIN, 400, 403, 403, 400)),
    # saving a diagnosis as knowledge: the walked session is not completed, so refused
    # with a message back on its page
    "diagnosis_pack:save-knowledge": ("POST", row(LOGIN, 302, 403, 403, 302)),
    # the walked session (an apron one) stored no bundle; auditors read masked, and the
    # bundle is raw
    "diagnosis_pack:bundle": ("GET", row(LOGIN, 404, 404, 403, 404)),
    "diagnosis:session-detail": ("GET", row(LOGIN, 200, 200, 200, 200)),
    "diagnosis:session-answer": ("POST", row(LOGIN, 302, 403, 403, 302)),
    "diagnosis:session-cancel": ("POST", row(LOGIN, 302, 403, 403, 302)),
    "diagnosis:session-close": ("POST", row(LOGIN, 302, 403, 403, 302)),
    "diagnosis:session-retry": ("POST", row(LOGIN, 302, 403, 403, 302)),
    "diagnosis:session-switch": ("POST", row(LOGIN, 302, 403, 403, 302)),  # no scenario
    "diagnosis:session-update": ("POST", row(LOGIN, 302, 403, 403, 302)),  # empty: message
    "diagnosis:session-correct": ("POST", row(LOGIN, 302, 403, 403, 302)),  # empty: message
    "diagnosis:session-events": ("GET", row(LOGIN, 200, 200, 200, 200)),
    "diagnosis:session-report": ("GET", row(LOGIN, 200, 200, 200, 200)),
    "diagnosis:session-delete": ("GET", row(LOGIN, 403, 403, 403, 200)),
    "airport:board": ("GET", row(LOGIN, 200, 200, 200, 200)),
    "airport:restriction-lift": ("POST", row(LOGIN, 302, 403, 403, 302)),
    "approvals:queue": ("GET", row(LOGIN, 403, 200, 403, 200)),
    "approvals:decide": ("POST", row(LOGIN, 403, 302, 403, 302)),
    "approvals:edit-args": ("POST", row(LOGIN, 403, 302, 403, 302)),  # empty: refused
    # a queue card's folded parts, loaded when opened: the queue's role; the editor of
    # an open approval only (the walk reaches /approvals/ first, its session still open)
    "approvals:edit-form": ("GET", row(LOGIN, 403, 200, 403, 200)),
    "approvals:incident-map": ("GET", row(LOGIN, 403, 200, 403, 200)),
    "approvals:bulk-decide": ("POST", row(LOGIN, 403, 302, 403, 302)),  # empty: refused
    "approvals:notify": ("POST", row(LOGIN, 403, 302, 403, 302)),
    "approvals:todo-list": ("GET", row(LOGIN, 200, 200, 403, 200)),  # approvers read
    "approvals:todo-resolve": ("POST", row(LOGIN, 302, 403, 403, 302)),
    "replay:history": ("GET", row(LOGIN, 200, 200, 200, 200)),
    "replay:replay-step": ("GET", row(LOGIN, 200, 200, 200, 200)),
    "replay:replay-event": ("GET", row(LOGIN, 200, 200, 200, 200)),
    "replay:replay-chain": ("GET", row(LOGIN, 200, 200, 200, 200)),
    "replay:replay-export": ("POST", row(LOGIN, 200, 200, 200, 200)),
    "replay:export-status": ("GET", row(LOGIN, 404, 404, 404, 404)),  # no such job
    "replay:export-download": ("GET", row(LOGIN, 404, 404, 404, 404)),
    "api-tokens:list": ("GET", row(LOGIN, 200, 200, 200, 200)),
    "api-tokens:create": ("POST", row(LOGIN, 400, 400, 400, 400)),  # empty form: errors
    "api-tokens:revoke": ("POST", row(LOGIN, 302, 404, 404, 404)),  # alice's token
}

# Admin pages as the admin sees them, by kind (the end of the URL name).
READ_ONLY_MODELS = {
    "aero_auditlog",
    "approvals_approval",
    "diagnosis_session",
    "diagnosis_event",
    "diagnosis_toolcall",
    "diagnosis_llmcall",
    "diagnosis_agentrun",
    "diagnosis_report",
    "airport_restriction",
    "diagnosis_pack_similarcase",  # what a diagnosis found; its event records them
    "scenarios_admin_scenarioversion",
    # gate decisions are records; the gate's settings are one row, made by its migration
    "ingest_gatesettings",
    "ingest_observation",
}
# Single pages that differ from their kind: a token is revoked (kept for the audit trail),
# never deleted; sign-in attempts (django-axes) are recorded, never added by hand (an
# admin may delete them to unlock someone).
ADMIN_PAGE_OVERRIDES = {
    "api_apitoken_delete": 403,
    "axes_accessattempt_add": 403,
    "axes_accesslog_add": 403,
    "axes_accessfailurelog_add": 403,
}
ADMIN_PAGES = {
    "index": 200,
    "login": 302,  # already signed in: on to the index
    "logout": 405,  # POST only
    "password_change": 200,
    "password_change_done": 200,
    "autocomplete": 200,
    "jsi18n": 200,
    "view_on_site": 404,  # the user model has no page on the site
    "app_list": 200,
    "auth_user_password_change": 200,
    "changelist": 200,
    "change": 200,
    "history": 200,
    "add": 200,
    "delete": 200,
    "object": 302,  # admin/<model>/<id>/ forwards to .../change/
    "catch_all": 404,
    "scenarios_admin_scenario_import": 200,
    "scenarios_admin_scenario_publish": 200,
    "scenarios_admin_scenario_diff": 200,
    "scenarios_admin_scenario_export": 200,
    "scenarios_admin_scenario_schema": 200,
    "django_rq": 200,
}
READ_ONLY_PAGES = {"add": 403, "delete": 403}
# django_rq's pages name jobs, workers and schedulers this test does not create. Some of
# them answer an unknown one with a server error: django_rq's behaviour, staff only, kept
# here as it is so a change (either way) is noticed.
DJANGO_RQ_PAGES = {
    "django_rq_job_detail": 404,
    "django_rq_result_detail": 404,
    "django_rq_delete_job": 500,
    "django_rq_requeue_job": 500,
    "django_rq_enqueue_job": 500,
    "django_rq_stop_job": 405,
    "django_rq_worker_details": 500,
    "django_rq_scheduler_jobs": 500,
    "django_rq_cron_scheduler_detail": 404,
    "django_rq_cron_job_detail": 404,
    "django_rq_confirm_action": 302,
    "django_rq_actions": 302,
    "django_rq_dashboard_add": 403,
    "django_rq_dashboard_delete": 500,
    "django_rq_dashboard_change": 500,
    "django_rq_dashboard_history": 500,
    "django_rq_dashboard_object": 302,
    "django_rq_home_json": 200,
    "django_rq_home_json_token": 302,  # a wrong API token
}
# Pages outside the admin's sign-in for users who are not staff.
NON_STAFF_ADMIN_PAGES = {
    "admin:login": 200,
    "admin:logout": 302,
    "admin:autocomplete": 302,
    "admin:django_rq_home_json": 401,  # token API
    "admin:django_rq_metrics": 401,
}

# The JSON API, alert ingest and /metrics take a bearer token, never the session cookie:
# each persona calls them with a token of their own (anonymous with none). Empty bodies,
# so a write that passes the access check is refused by validation (422) or, for the
# generic alert form, answered as an alert that matches no scenario.
TOKEN_URLS: dict[str, tuple[str, dict[str, Any]]] = {
    "api:openapi-json": ("GET", row(200, 200, 200, 200, 200)),
    "api:openapi-view": ("GET", row(200, 200, 200, 200, 200)),
    "api:api-root": ("GET", row(404, 404, 404, 404, 404)),  # nothing at the root
    "api:list_sessions": ("GET", row(401, 200, 200, 200, 200)),
    "api:create_session": ("POST", row(401, 422, 403, 403, 422)),
    "api:get_session": ("GET", row(401, 200, 200, 200, 200)),
    "api:cancel_session": ("POST", row(401, 200, 403, 403, 200)),  # admin: canceled already
    "api:resume_session": ("POST", row(401, 409, 403, 403, 409)),  # nothing to resume
    "api:answer_session": ("POST", row(401, 422, 403, 403, 422)),
    "api:timeline": ("GET", row(401, 200, 200, 200, 200)),
    "api:agent_tree": ("GET", row(401, 200, 200, 200, 200)),
    "api:pending_approvals": ("GET", row(401, 200, 200, 200, 200)),
    "api:get_approval": ("GET", row(401, 200, 200, 200, 200)),
    "api:approve": ("POST", row(401, 403, 422, 403, 422)),
    "api:confirm": ("POST", row(401, 403, 422, 403, 422)),
    "api:reject": ("POST", row(401, 403, 422, 403, 422)),
    "api:search": ("GET", row(401, 200, 200, 200, 200)),
    "api:diagnosis_history": ("GET", row(401, 200, 200, 200, 200)),
    "api:replay_session": ("GET", row(401, 200, 200, 200, 200)),
    "api:get_session_bundle": ("GET", row(401, 404, 404, 403, 404)),  # as diagnosis_pack:bundle
    "api:export_markdown": ("POST", row(401, 200, 200, 200, 200)),
    "api:export_job": ("GET", row(401, 404, 404, 404, 404)),  # no such job
    # the diagnosis pack's knowledge base: read by every role, written by operators and
    # admins (an empty body has no title: 422)
    "api:list_knowledge_items": ("GET", row(401, 200, 200, 200, 200)),
    "api:create_knowledge_item": ("POST", row(401, 422, 403, 403, 422)),
    "api:get_knowledge_item": ("GET", row(401, 200, 200, 200, 200)),  # a shipped item
    # MCP servers and model providers: admins only (an empty test body names neither a
    # server nor a definition: 422)
    "api:list_mcp_servers": ("GET", row(401, 403, 403, 403, 200)),
    "api:test_mcp_server": ("POST", row(401, 403, 403, 403, 422)),
    "api:list_llm_models": ("GET", row(401, 403, 403, 403, 200)),
    # skills: admins only (an upload without its zip: 422)
    "api:upload_skill": ("POST", row(401, 403, 403, 403, 422)),
    "api:list_skills": ("GET", row(401, 403, 403, 403, 200)),
    "api:list_skill_versions": ("GET", row(401, 403, 403, 403, 200)),
    "ingest:alertmanager": ("POST", row(401, 422, 403, 403, 422)),
    "ingest:alerts": ("POST", row(401, 422, 403, 403, 422)),
    "metrics": ("GET", row(200, 200, 200, 200, 200)),  # the test client is on loopback
    "api/v1/^.*$": ("GET", row(404, 404, 404, 404, 404)),  # unknown paths: a JSON 404
}
TOKEN_ROUTES = ("api/v1/", "ingest/", "metrics")


def token_route(route: str) -> bool:
    return route.startswith(TOKEN_ROUTES)


WEBSOCKETS = {
    "ws/sessions/<uuid:session_id>/": row(False, True, True, True, True),
    "ws/approvals/": row(False, False, True, False, True),
    "ws/airport/": row(False, True, True, True, True),
    "ws/todos/": row(False, True, True, False, True),
}


# --- walking the resolver ----------------------------------------------------------------


def walk(
    patterns: list[Any], prefix: str = "", namespace: str = ""
) -> Iterator[tuple[str, str, URLPattern]]:
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            ns = pattern.namespace or ""
            full = f"{namespace}:{ns}" if namespace and ns else (ns or namespace)
            yield from walk(pattern.url_patterns, prefix + str(pattern.pattern), full)
        else:
            name = f"{namespace}:{pattern.name}" if namespace and pattern.name else pattern.name
            yield prefix + str(pattern.pattern), name or "", pattern


def all_patterns() -> list[tuple[str, str, URLPattern]]:
    return list(walk(get_resolver().url_patterns))


def admin_kind(route: str, name: str) -> str:
    if not name:
        return "catch_all" if route.endswith("(?P<url>.*)$") else "object"
    short = name.removeprefix("admin:")
    if short in ADMIN_PAGES:
        return short
    return short.rsplit("_", 1)[-1]


def admin_expected(route: str, name: str, ids: dict[str, str] | None = None) -> int:
    if name.startswith("admin_moved_"):
        return 301  # to the same page at the model's new address (tests/test_admin_moved.py)
    short = name.removeprefix("admin:")
    if "django_rq" in route:
        kind = short or "django_rq_dashboard_object"
        if "<token>" in route:
            kind += "_token"
        return DJANGO_RQ_PAGES.get(kind, ADMIN_PAGES["django_rq"])
    if short in ADMIN_PAGE_OVERRIDES:
        return ADMIN_PAGE_OVERRIDES[short]
    kind = admin_kind(route, name)
    model = short.rsplit("_", 1)[0]
    if kind in READ_ONLY_PAGES and model in READ_ONLY_MODELS:
        return READ_ONLY_PAGES[kind]
    if ids is not None and ids.get(model) == "0" and kind in ("change", "history", "delete"):
        return 302  # a model without rows here: the admin goes back to its index
    return ADMIN_PAGES[kind]


# --- the world the table is walked in ---------------------------------------------------


@pytest.fixture
def world(builtin: None, make_user: Callable[..., User]) -> dict[str, Any]:
    people: dict[str, Any] = {
        ANON: None,
        OP: make_user("alice", "operator"),
        APP: make_user("bob", "approver"),
        AUD: make_user("carol", "auditor"),
        ADM: User.objects.create_superuser("root", password="pw-for-tests"),
    }
    # Made by its migration, but a transactional test's flush before this one drops it.
    GateSettings.load()
    session = waiting_session(people[OP])
    crew = approval_for(session, "dispatch_cleanup_crew")
    closure = approval_for(session, "close_taxiway", taxiway="A")
    todo = ManualTodo.objects.create(
        approval=closure, session=session, title="close_taxiway: handle it by hand"
    )
    restriction = Restriction.objects.create(
        kind="taxiway",
        target="B",
        session=session,
        tool_call=ToolCall.objects.get(
            pk=approval_for(session, "close_taxiway", taxiway="B").tool_call_id
        ),
    )
    # every admin model has an object for its change pages (provider, report)
    ProviderConfig.objects.create(name="local", kind="offline")
    McpServer.objects.create(name="time", command="{python}", args=["-m", "mcp_server_time"])
    skill = Skill.objects.create(name="count-errors")
    Report.objects.create(session=session, language="en", markdown="# Report")
    return {
        "people": people,
        "kwargs": {
            "session_id": session.pk,
            "approval_id": crew.pk,
            "todo_id": todo.pk,
            "restriction_id": restriction.pk,
            "seq": 1,
            "job_id": "no-such-job",
            "token_id": ApiToken.issue(people[OP], "table", ["operator"])[0].pk,
            "approval_id_api": crew.pk,
            "skill_id": skill.pk,
        },
        "session": session,
    }


def object_ids() -> dict[str, str]:
    """The first object of each admin model, by URL name prefix."""
    from django.contrib import admin

    ids = {}
    for model in admin.site._registry:
        if model._meta.app_label == "django_rq":
            continue  # a dashboard, not a table
        first = model._default_manager.order_by("pk").first()
        key = f"{model._meta.app_label}_{model._meta.model_name}"
        ids[key] = str(first.pk) if first is not None else "0"
    return ids


REGEX_VALUES = {"token": "no-such-token", "app_label": "aero", "url": "nothing-here/"}


def regex_url(route: str) -> str:
    """A URL a regex route matches: each group filled in, anchors dropped."""
    filled = re.sub(r"\(\?P<(\w+)>[^)]*\)\??", lambda m: REGEX_VALUES[m.group(1)], route)
    return "/" + filled.replace("^", "").replace("/?$", "/").replace("$", "")


def admin_url(route: str, name: str, pattern: URLPattern, ids: dict[str, str]) -> str:
    if "^" in route or "(?P<" in route:
        url = regex_url(route)
        return url
    if not name:
        model_route = route.removesuffix("<path:object_id>/")
        app, model = model_route.removeprefix("admin/").strip("/").split("/")
        return f"/{model_route}{ids.get(f'{app}_{model}', '0')}/"
    if name.startswith("admin_moved_"):  # an old address of a model a pack took over
        return reverse(name, kwargs={"object_id": "0"} if "<path:object_id>" in route else {})
    short = name.removeprefix("admin:")
    values = {
        "object_id": ids.get(short.rsplit("_", 1)[0], "0"),
        "id": ids["auth_user"],
        "content_type_id": str(ContentType.objects.get_for_model(User).pk),
        "app_label": "aero",
        "queue_index": 0,
        "scheduler_index": 0,
        "connection_index": 0,
        "job_id": "no-such-job",
        "result_id": "no-such-result",
        "key": "no-such-worker",
        "scheduler_name": "no-such-scheduler",
        "cron_job_name": "no-such-job",
        "token": "no-such-token",
    }
    if name == "admin:view_on_site":
        values["object_id"] = ids["auth_user"]
    wanted = list(pattern.pattern.regex.groupindex)
    url = reverse(name, kwargs={k: values[k] for k in wanted})
    if name == "admin:autocomplete":
        # a field without autocomplete: refused (Django raises on no parameters at all)
        url += "?app_label=auth&model_name=user&field_name=groups"
    return url


def request(client: Client, method: str, url: str) -> Any:
    return client.post(url, {}) if method == "POST" else client.get(url)


def client_for(user: User | None) -> Client:
    # A server error is an outcome like any other (and never an expected one here).
    client = Client(raise_request_exception=False)
    if user is not None:
        client.force_login(user)
    return client


def outcome(response: Any, url: str) -> Any:
    if response.status_code == 302:
        if response["Location"] == f"{reverse('login')}?next={url}":
            return LOGIN
        if response["Location"] == f"{reverse('admin:login')}?next={url}":
            return ADMIN_LOGIN
    return response.status_code


# --- the tests ------------------------------------------------------------------------


def test_every_url_pattern_has_a_row() -> None:
    missing = [
        f"{name or route}"
        for route, name, _ in all_patterns()
        if not route.startswith("admin/") and name not in URLS and not token_route(route)
    ]
    missing += [
        name or route
        for route, name, _ in all_patterns()
        if token_route(route) and (name or route) not in TOKEN_URLS
    ]
    assert missing == [], "add these URL patterns to the access table"
    assert set(URLS) <= {name for _, name, _ in all_patterns()}, "rows for removed URLs"
    assert set(TOKEN_URLS) <= {name or route for route, name, _ in all_patterns()}


def test_every_admin_page_has_an_expected_outcome() -> None:
    for route, name, _ in all_patterns():
        if route.startswith("admin/"):
            admin_expected(route, name)  # KeyError: a new kind of admin page


def test_the_site_pages(world: dict[str, Any]) -> None:
    failures = []
    for route, name, pattern in all_patterns():
        if route.startswith("admin/") or token_route(route):
            continue
        method, expected = URLS[name]
        wanted = (
            set(pattern.pattern.converters) if hasattr(pattern.pattern, "converters") else set()
        )
        url = reverse(name, kwargs={k: world["kwargs"][k] for k in wanted})
        for persona in PERSONAS:
            got = outcome(request(client_for(world["people"][persona]), method, url), url)
            if got != expected[persona]:
                failures.append(f"{method} {url} as {persona}: {got}, expected {expected[persona]}")
    assert failures == []


def test_the_admin_pages(world: dict[str, Any]) -> None:
    ids = object_ids()
    clients = {p: client_for(world["people"][p]) for p in PERSONAS}
    failures = []
    for route, name, pattern in all_patterns():
        if not route.startswith("admin/") or token_route(route):
            continue
        url = admin_url(route, name, pattern, ids)
        for persona in PERSONAS:
            if persona == ADM:
                expected: Any = admin_expected(route, name, ids)
            elif name in NON_STAFF_ADMIN_PAGES and "<token>" not in route:
                expected = NON_STAFF_ADMIN_PAGES[name]
            else:
                expected = ADMIN_LOGIN
            got = outcome(clients[persona].get(url), url)
            if got != expected:
                failures.append(
                    f"GET {url} ({name or route}) as {persona}: {got}, expected {expected}"
                )
    assert failures == []


def test_the_token_routes(world: dict[str, Any]) -> None:
    """The JSON API, ingest and /metrics, each persona with a bearer token of its own."""
    tokens = {
        persona: None if user is None else ApiToken.issue(user, "table", [])[1]
        for persona, user in world["people"].items()
    }
    kwargs = {
        "session_id": str(world["session"].pk),
        "approval_id": world["kwargs"]["approval_id"],
        "job_id": "no-such-job",
        "item_id": "KB-001",
        "skill_id": world["kwargs"]["skill_id"],
    }
    failures = []
    for route, name, pattern in all_patterns():
        if not token_route(route):
            continue
        method, expected = TOKEN_URLS[name or route]
        if name:
            wanted = (
                set(pattern.pattern.converters) if hasattr(pattern.pattern, "converters") else set()
            )
            url = reverse(name, kwargs={k: kwargs[k] for k in wanted})
        else:
            url = "/api/v1/no-such-thing"
        for persona in PERSONAS:
            token = tokens[persona]
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            client = Client(raise_request_exception=False, headers=headers)
            if method == "POST":
                response = client.post(url, "{}", content_type="application/json")
            else:
                response = client.get(url)
            if response.status_code != expected[persona]:
                failures.append(
                    f"{method} {url} as {persona}: {response.status_code}, "
                    f"expected {expected[persona]}"
                )
    assert failures == []


# --- WebSocket routes, with a real client against daphne ---------------------------------


def websocket_routes() -> list[str]:
    from aero.serving import page_routes

    return [str(p.pattern) for p in page_routes()]


def test_every_websocket_route_has_a_row() -> None:
    from api.routing import websocket_urlpatterns as api_sockets

    assert sorted(websocket_routes()) == sorted(WEBSOCKETS)
    # the API stream (with and without a trailing slash): test_the_api_stream
    assert {str(p.pattern).rstrip("/") for p in api_sockets} == {API_STREAM}


def cookie_for(user: User) -> str:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}"


def accepted(base: str, path: str, user: User | None) -> bool:
    headers = {"Origin": base} | ({"Cookie": cookie_for(user)} if user else {})
    url = base.replace("http://", "ws://") + path
    try:
        # max_queue=None: frames the test leaves unread never stop the client reading, so
        # its close sees the server's close frame (past 16 unread frames websockets stops
        # reading and every close waited out its 10 s timeout).
        with connect(url, open_timeout=10, max_queue=None, additional_headers=headers) as ws:
            return isinstance(ws.recv(timeout=10), str)  # a first update arrives
    except (InvalidStatus, ConnectionClosed):
        return False


def test_the_websocket_routes(world: dict[str, Any], asgi_server: str) -> None:
    paths = {
        "ws/sessions/<uuid:session_id>/": f"/ws/sessions/{world['session'].pk}/",
        "ws/approvals/": "/ws/approvals/",
        "ws/airport/": "/ws/airport/",
        "ws/todos/": "/ws/todos/",
    }
    got = {
        route: {p: accepted(asgi_server, paths[route], world["people"][p]) for p in PERSONAS}
        for route in WEBSOCKETS
    }
    assert got == WEBSOCKETS


def api_stream_opens(base: str, path: str, token: str | None) -> bool:
    """The API stream accepts, then closes with 4401/4403 when refused: it is open when
    its first frame is an event envelope."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    url = base.replace("http://", "ws://") + path
    try:
        with connect(url, open_timeout=10, max_queue=None, additional_headers=headers) as ws:
            return '"event_id"' in str(ws.recv(timeout=10))
    except (InvalidStatus, ConnectionClosed):
        return False


API_STREAM = "ws/api/sessions/<str:session_id>"


def test_the_api_stream(world: dict[str, Any], asgi_server: str) -> None:
    path = f"/ws/api/sessions/{world['session'].pk}"
    got = {
        persona: api_stream_opens(
            asgi_server,
            path,
            None if user is None else ApiToken.issue(user, "table", [])[1],
        )
        for persona, user in world["people"].items()
    }
    assert got == row(False, True, True, True, True)
