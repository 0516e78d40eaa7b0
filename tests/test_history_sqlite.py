"""History search in embedded mode: SQLite with the FTS5 trigram table that replay's
migration creates and its triggers keep (the PostgreSQL path is in test_replay.py)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.servers import run_embedded

SCRIPT = """
import json, django
django.setup()
from django.core.management import call_command
from django.contrib.auth.models import User
from diagnosis.actions import do_create_session
from diagnosis.models import Session
from replay.history import search
from scenarios_admin.builtin import load_builtin_data
from scenarios_admin.models import Scenario

call_command("migrate", verbosity=0)
load_builtin_data()
user = User.objects.create_user("alice")
oil = Scenario.objects.get(slug="oil_spill")
chinese = do_create_session(user, oil, "CA1234 在105机位燃油泄漏，发动机仍在运转，还在持续漏")
english = do_create_session(user, oil, "MU5678 fuel leak near stand 101")
gone = do_create_session(user, oil, "ZH9527 燃油泄漏 in a deleted session")
Session.objects.filter(pk=gone.pk).update(deleted_at="2026-01-01T00:00:00Z")
diag = do_create_session(user, oil, "a session standing in for a concluded diagnosis")
cause = {"root_cause": {"service": "payments", "problem_type": "error_spike"}}
Session.objects.filter(pk=diag.pk).update(snapshot=cause)
names = {chinese.pk: "chinese", english.pk: "english", gone.pk: "gone", diag.pk: "diag"}

def titles(**data):
    return sorted(names[row["session"].pk] for row in search(data).rows)

print(json.dumps({
    "inside_a_word": titles(q="发动机仍在运转"),
    "two_chars": titles(q="燃油"),
    "english": titles(q="fuel leak"),
    "quote": titles(q='say "hi'),
    "flight": titles(flight="MU5678"),
    "position": titles(position="105"),
    "all": titles(),
    "service": titles(service="payments"),
    "problem_type": titles(problem_type="error_spike"),
    "facts": [row["facts"] for row in search({"service": "payments"}).rows],
}))
"""


def test_history_search_on_sqlite(tmp_path: Path) -> None:
    run = run_embedded(tmp_path, "-c", SCRIPT, timeout=180, AERO_JOB_BACKEND="inline")
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result == {
        "inside_a_word": ["chinese"],
        "two_chars": ["chinese"],  # shorter than a trigram: LIKE over the FTS table
        "english": ["english"],
        "quote": [],  # FTS5 syntax in the text is matched as text, not parsed
        "flight": ["english"],
        "position": ["chinese"],
        "all": ["chinese", "diag", "english"],  # the deleted session is not listed
        # a pack's facts out of the snapshot (json_extract here)
        "service": ["diag"],
        "problem_type": ["diag"],
        "facts": [{"service": "payments", "problem_type": "error_spike"}],
    }
