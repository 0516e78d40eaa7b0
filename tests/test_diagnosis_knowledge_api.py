"""/api/v1/knowledge-items as a client meets it: any role that may view sessions reads
the knowledge base (listed by id, filtered, searched as similar cases are, paged with a
cursor); operators and admins add to it, once per Idempotency-Key, audited like the
admin's add; everything else is refused with a problem body and writes nothing."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from aero.models import AuditLog
from packs.diagnosis.models import KnowledgeItem, KnowledgeSource
from tests.api_helpers import call, token_for

ITEMS = "/api/v1/knowledge-items"
PROBLEM = "application/problem+json"
BODY = {
    "key": "KB-900",
    "title_en": "Orders time out after the cache node restarted",
    "title_zh": "缓存节点重启后订单超时",
    "problem_type": "slow_response",
    "hypothesis": "upstream_slow",
    "services": ["orders", "cache"],
    "tags": ["latency"],
    "symptoms_en": "p99 of /orders above 5 s, cache hit ratio near zero",
    "root_cause_en": "the cache came back empty and every read went to the database",
    "fix_en": "warm the cache before putting the node back",
}


def item(key: str, **fields: Any) -> KnowledgeItem:
    return KnowledgeItem.objects.create(key=key, title_en=fields.pop("title_en", key), **fields)


@pytest.fixture
def shelf(db: None) -> None:
    item(
        "KB-101",
        problem_type="error_spike",
        hypothesis="bad_deploy",
        services=["payments"],
        symptoms_en="payments answer 500 after the release of version 2.4",
    )
    item(
        "KB-102",
        problem_type="resource_exhaustion",
        hypothesis="db_pool_exhausted",
        services=["inventory"],
        symptoms_en="inventory waits for database connections, the pool is exhausted",
    )
    item(
        "KB-103",
        problem_type="error_spike",
        hypothesis="config_error",
        services=["payments", "gateway"],
        symptoms_en="gateway rejects payments after a configuration change",
    )
    item("KB-104", problem_type="slow_response", services=["cache"], symptoms_en="cache slow")


# --- who may -----------------------------------------------------------------------------


def test_no_token_is_a_401_problem(shelf: None) -> None:
    for method, path in (("GET", ITEMS), ("GET", f"{ITEMS}/KB-101"), ("POST", ITEMS)):
        response = call(method, path, None, BODY if method == "POST" else None)
        assert response.status_code == 401, (method, path)
        assert response["Content-Type"] == PROBLEM
        assert response.json()["code"] == "unauthenticated"
        assert response["WWW-Authenticate"].startswith("Bearer")
    # a revoked or made-up token is no better
    assert call("GET", ITEMS, "aero_not-a-token").status_code == 401
    assert not KnowledgeItem.objects.filter(key="KB-900").exists()


def test_every_viewing_role_reads_and_only_operators_and_admins_write(
    shelf: None, make_user: Any
) -> None:
    people = {
        role: make_user(f"kb-{role}", role) for role in ("operator", "approver", "auditor", "admin")
    }
    for role, user in people.items():
        token = token_for(user)
        assert call("GET", ITEMS, token).status_code == 200, role
        assert call("GET", f"{ITEMS}/KB-101", token).status_code == 200, role
        created = call("POST", ITEMS, token, {**BODY, "key": f"KB-9{role[:3]}"})
        assert created.status_code == (201 if role in ("operator", "admin") else 403), role
    refused = call("POST", ITEMS, token_for(people["approver"]), BODY)
    assert refused["Content-Type"] == PROBLEM and refused.json()["code"] == "forbidden"
    assert sorted(
        KnowledgeItem.objects.filter(key__startswith="KB-9").values_list("key", flat=True)
    ) == [
        "KB-9adm",
        "KB-9ope",
    ]


def test_a_token_scoped_below_the_users_roles_is_refused(shelf: None, make_user: Any) -> None:
    both = make_user("kb-both", "operator", "auditor")
    reader = token_for(both, "auditor")
    # the role check runs before the body is read: a 403 whatever is sent
    for body in (BODY, {"title_en": ""}, {"no": "such field"}):
        response = call("POST", ITEMS, reader, body)
        assert response.status_code == 403
        assert response.json()["code"] == "forbidden"
    assert call("GET", ITEMS, reader).status_code == 200
    assert not KnowledgeItem.objects.filter(key="KB-900").exists()
    # a user without any role reads nothing, even with a token
    nobody = token_for(make_user("kb-nobody"))
    assert call("GET", ITEMS, nobody).status_code == 403
    assert call("GET", f"{ITEMS}/KB-101", nobody).status_code == 403


def test_an_unknown_id_is_a_404_problem(shelf: None, alice: User) -> None:
    response = call("GET", f"{ITEMS}/KB-999", token_for(alice))
    assert response.status_code == 404
    assert response["Content-Type"] == PROBLEM
    body = response.json()
    assert body["code"] == "not_found" and "KB-999" in body["detail"]
    assert body["instance"] == f"{ITEMS}/KB-999"


# --- reading ---------------------------------------------------------------------------


def test_an_item_reads_as_stored(db: None, alice: User) -> None:
    stored = item("KB-200", title_zh="标题", services=["orders"], tags=["t"], created_by=alice)
    body = call("GET", f"{ITEMS}/KB-200", token_for(alice)).json()
    assert body["id"] == "KB-200"
    assert body["title_zh"] == "标题" and body["title_en"] == "KB-200"
    assert body["services"] == ["orders"] and body["tags"] == ["t"]
    assert body["source"] == KnowledgeSource.ADMIN
    assert body["created_by"] == "alice" and body["session_id"] is None
    assert body["score"] is None
    assert stored.created_at.isoformat().startswith(body["created_at"][:19])


def test_the_list_is_by_id_and_pages_with_a_cursor(shelf: None, alice: User) -> None:
    token = token_for(alice)
    first = call("GET", f"{ITEMS}?limit=3", token).json()
    assert [i["id"] for i in first["items"]] == ["KB-101", "KB-102", "KB-103"]
    # an item added now, before the cursor's position, does not shift the next page
    item("KB-100")
    second = call("GET", f"{ITEMS}?limit=3&cursor={first['next_cursor']}", token).json()
    assert [i["id"] for i in second["items"]] == ["KB-104"]
    assert second["next_cursor"] is None
    # a cursor of another list is no page here
    other = call("GET", f"{ITEMS}?cursor=eyJrIjoic2Vzc2lvbnMifQ", token)
    assert other.status_code == 404 and other.json()["code"] == "invalid_cursor"


def test_the_filters(shelf: None, alice: User) -> None:
    token = token_for(alice)

    def ids(query: str) -> list[str]:
        response = call("GET", f"{ITEMS}?{query}", token)
        assert response.status_code == 200, response.content
        return [i["id"] for i in response.json()["items"]]

    assert ids("problem_type=error_spike") == ["KB-101", "KB-103"]
    assert ids("service=payments") == ["KB-101", "KB-103"]
    assert ids("service=gateway") == ["KB-103"]
    assert ids("problem_type=error_spike&service=gateway") == ["KB-103"]
    # a service only named in the text is not one the item names
    assert ids("service=release") == []
    assert ids("problem_type=no_such_type") == []


def test_q_searches_as_similar_cases_are_best_first(shelf: None, alice: User) -> None:
    token = token_for(alice)
    found = call("GET", f"{ITEMS}?q=database connections pool exhausted", token).json()["items"]
    assert found[0]["id"] == "KB-102"
    scores = [i["score"] for i in found]
    assert scores == sorted(scores, reverse=True) and 0 < scores[0] <= 1
    # the filters narrow the search
    narrowed = call("GET", f"{ITEMS}?q=payments&problem_type=error_spike", token).json()["items"]
    assert {i["id"] for i in narrowed} == {"KB-101", "KB-103"}
    assert call("GET", f"{ITEMS}?q=payments&service=inventory", token).json()["items"] == []
    # a query without a word (punctuation only) finds nothing, and says so
    nothing = call("GET", f"{ITEMS}?q=%2F%3F%C2%91%3D", token)
    assert nothing.status_code == 200 and nothing.json()["items"] == []


def test_a_search_pages_in_its_own_order(shelf: None, alice: User) -> None:
    token = token_for(alice)
    whole = call("GET", f"{ITEMS}?q=payments", token).json()
    assert len(whole["items"]) >= 2 and whole["next_cursor"] is None
    first = call("GET", f"{ITEMS}?q=payments&limit=1", token).json()
    rest = call("GET", f"{ITEMS}?q=payments&limit=50&cursor={first['next_cursor']}", token).json()
    paged = [i["id"] for i in first["items"] + rest["items"]]
    assert paged == [i["id"] for i in whole["items"]]
    # the cursor belongs to its query
    other = call("GET", f"{ITEMS}?q=cache&cursor={first['next_cursor']}", token)
    assert other.status_code == 404


@pytest.mark.parametrize(
    "query",
    ["limit=0", "limit=101", "problem_type=Bad Type", "service=a;b", "cursor=not*a*cursor", "x=1"],
)
def test_bad_query_values_are_422_problems(shelf: None, alice: User, query: str) -> None:
    response = call("GET", f"{ITEMS}?{query}", token_for(alice))
    assert response.status_code == 422, response.content
    assert response["Content-Type"] == PROBLEM


# --- writing ---------------------------------------------------------------------------


def test_an_operator_adds_an_item_audited_like_the_admins_add(db: None, alice: User) -> None:
    response = call("POST", ITEMS, token_for(alice), BODY)

    assert response.status_code == 201, response.content
    assert response["Location"] == f"{ITEMS}/KB-900"
    body = response.json()
    assert body["id"] == "KB-900" and body["source"] == "api" and body["created_by"] == "alice"
    stored = KnowledgeItem.objects.get(key="KB-900")
    assert stored.created_by == alice and stored.services == ["orders", "cache"]
    assert "warm the cache" in stored.search_text  # searchable at once
    entry = AuditLog.objects.get(action="knowledge.created")
    assert entry.actor == alice and entry.object_id == str(stored.pk)
    assert entry.detail["key"] == "KB-900" and "fix_en" in entry.detail["fields"]
    # and it reads back as it was answered
    again = call("GET", response["Location"], token_for(alice)).json()
    assert again == {**body, "updated_at": again["updated_at"]}


def test_without_a_key_one_is_made(db: None, alice: User) -> None:
    body = {k: v for k, v in BODY.items() if k != "key"}
    response = call("POST", ITEMS, token_for(alice), body)
    assert response.status_code == 201
    made = response.json()["id"]
    assert made.startswith("K-") and len(made) == 10
    assert KnowledgeItem.objects.filter(key=made).exists()


def test_a_key_already_taken_is_a_409_and_changes_nothing(db: None, alice: User) -> None:
    item("KB-900", title_en="the first one")
    response = call("POST", ITEMS, token_for(alice), BODY)
    assert response.status_code == 409
    assert response["Content-Type"] == PROBLEM and response.json()["code"] == "key_taken"
    assert KnowledgeItem.objects.get(key="KB-900").title_en == "the first one"
    assert not AuditLog.objects.filter(action="knowledge.created").exists()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"title_en": "", "title_zh": ""}, "title_zh or title_en"),
        ({"services": ["orders", ""]}, "services"),
        ({"services": "orders"}, "services"),
        ({"tags": [" "]}, "tags"),
        ({"problem_type": "Slow Response"}, "problem_type"),
        ({"key": "no spaces please"}, "key"),
        ({"title_en": "x" * 201}, "title_en"),
        ({"fix_en": "a\x00b"}, "fix_en"),
        ({"source": "shipped"}, "source"),  # not the client's to say
    ],
)
def test_bad_input_is_a_422_naming_the_field_and_creates_nothing(
    db: None, alice: User, change: dict[str, Any], field: str
) -> None:
    response = call("POST", ITEMS, token_for(alice), {**BODY, **change})
    assert response.status_code == 422, response.content
    assert response["Content-Type"] == PROBLEM
    body = response.json()
    assert body["code"] == "invalid_input"
    assert field in body["detail"] or any(field in e["loc"] for e in body["errors"]), body
    assert not KnowledgeItem.objects.exists()
    assert not AuditLog.objects.filter(action="knowledge.created").exists()


def test_a_body_that_is_not_json_is_refused(db: None, alice: User) -> None:
    client = Client(headers={"Authorization": f"Bearer {token_for(alice)}"})
    response = client.post(ITEMS, "{not json", content_type="application/json")
    assert response.status_code in (400, 422)
    assert response["Content-Type"] == PROBLEM
    assert not KnowledgeItem.objects.exists()


def test_the_same_idempotency_key_adds_once(db: None, alice: User, make_user: Any) -> None:
    token = token_for(alice)
    key = {"Idempotency-Key": "kb-add-1"}
    body = {k: v for k, v in BODY.items() if k != "key"}  # a made key would differ

    first = call("POST", ITEMS, token, body, key)
    again = call("POST", ITEMS, token, body, key)
    other = call("POST", ITEMS, token, {**body, "title_en": "something else"}, key)

    assert first.status_code == 201 and "Idempotent-Replayed" not in first
    assert again.status_code == 201 and again.json() == first.json()
    assert again["Idempotent-Replayed"] == "true"
    assert again["Location"] == first["Location"]
    assert other.status_code == 422 and other.json()["code"] == "idempotency_key_reused"
    assert KnowledgeItem.objects.count() == 1
    assert AuditLog.objects.filter(action="knowledge.created").count() == 1
    # keys are per user: another operator's same key is a new request
    theirs = call("POST", ITEMS, token_for(make_user("kb-op2", "operator")), body, key)
    assert theirs.status_code == 201 and theirs.json()["id"] != first.json()["id"]


def test_a_refused_request_leaves_its_key_free(db: None, alice: User) -> None:
    token = token_for(alice)
    key = {"Idempotency-Key": "kb-add-2"}
    item("KB-900")
    assert call("POST", ITEMS, token, BODY, key).status_code == 409
    fixed = call("POST", ITEMS, token, {**BODY, "key": "KB-901"}, key)
    assert fixed.status_code == 201 and "Idempotent-Replayed" not in fixed


# --- the document -------------------------------------------------------------------------


def test_the_openapi_document_lists_the_three_operations(db: None) -> None:
    schema = Client().get("/api/v1/openapi.json").json()
    listed = schema["paths"][ITEMS]
    one = schema["paths"][f"{ITEMS}/{{item_id}}"]
    assert listed["get"]["operationId"] == "listKnowledgeItems"
    assert listed["post"]["operationId"] == "createKnowledgeItem"
    assert one["get"]["operationId"] == "getKnowledgeItem"
    created = listed["post"]["responses"]["201"]
    assert {"Location", "Idempotent-Replayed"} <= set(created["headers"])
    assert PROBLEM in listed["post"]["responses"]["422"]["content"]
    assert {p["name"] for p in listed["get"]["parameters"]} >= {
        "q",
        "problem_type",
        "service",
        "limit",
        "cursor",
    }
    assert "Idempotency-Key" in {p["name"] for p in listed["post"]["parameters"]}
