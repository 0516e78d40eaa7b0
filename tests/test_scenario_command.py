"""`manage.py scenario check|export|import` and the built-in loader, as an admin scripting
them sees it: output, exit status (CommandError = non-zero) and what changed."""

from __future__ import annotations

import copy
import shutil
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.management import call_command
from django.core.management.base import CommandError

from aero.models import AuditLog
from packs.airport.models import RiskRule, ScenarioExample
from scenarios_admin import builtin
from scenarios_admin.builtin import load_builtin_data
from scenarios_admin.draft import assemble
from scenarios_admin.models import Scenario, ScenarioVersion
from scenarios_admin.yamlio import dump_definition
from tests.builtin_data import builtin_definition

pytestmark = pytest.mark.services


def run(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("scenario", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def run_failing(*args: str) -> tuple[str, str, str]:
    out, err = StringIO(), StringIO()
    with pytest.raises(CommandError) as error:
        call_command("scenario", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue(), str(error.value)


def versions(slug: str) -> list[int]:
    return list(
        ScenarioVersion.objects.filter(scenario__slug=slug)
        .order_by("number")
        .values_list("number", flat=True)
    )


# --- check ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("slug", "cases"), [("bird_strike", 5), ("tire_burst", 6), ("oil_spill", 2)]
)
def test_check_passes_every_shipped_case(builtin: None, slug: str, cases: int) -> None:
    out, _ = run("check", slug)
    lines = out.splitlines()

    assert lines[0] == f"{slug} (draft): {cases} example cases"
    assert [line.split(":")[0] for line in lines[1:-1]] == [
        f"PASS {i}" for i in range(1, cases + 1)
    ]
    assert lines[-1] == f"{cases} passed, 0 failed"


def test_check_prints_each_failure_and_exits_non_zero(builtin: None) -> None:
    example = ScenarioExample.objects.get(scenario__slug="bird_strike", rule="BS-01")
    example.expected_fields = example.expected_fields.replace("TAKEOFF_ROLL", "CLIMB")
    example.save()

    out, _, error = run_failing("check", "bird_strike")

    assert "FAIL 1: CA1234 起飞滑跑时在跑道06/24发生鸟击，鸟吸入发动机 -> BS-01 HIGH" in out
    assert "     - field phase: expected CLIMB, got TAKEOFF_ROLL" in out
    assert "PASS 2:" in out
    assert out.splitlines()[-1] == "4 passed, 1 failed"
    assert error == "bird_strike (draft): 1 of 5 example cases failed"


def test_check_a_published_version(builtin: None) -> None:
    out, _ = run("check", "tire_burst", "--version", "1")
    assert out.splitlines()[0] == "tire_burst v1: 6 example cases"

    _, _, error = run_failing("check", "tire_burst", "--version", "7")
    assert error == "tire_burst has no version 7"


def test_check_an_unknown_scenario(builtin: None) -> None:
    _, _, error = run_failing("check", "volcano")
    assert error == (
        "unknown scenario 'volcano' (known: bird_strike, it_diagnosis, oil_spill, tire_burst)"
    )


# --- export / import -------------------------------------------------------------------------


def test_export_import_export_is_byte_exact(builtin: None, tmp_path: Path) -> None:
    first = tmp_path / "bird_strike.yaml"
    out, _ = run("export", "bird_strike", "--out", str(first))
    assert out == f"bird_strike: written to {first}\n"

    out, _ = run("import", str(first))
    assert out == "bird_strike: draft replaced\n"
    second, _ = run("export", "bird_strike", "--draft")

    assert second == first.read_text(encoding="utf-8")
    assert (
        yaml.safe_load(second)
        == ScenarioVersion.objects.get(scenario__slug="bird_strike", number=1).definition
    )


def test_export_to_standard_output_is_the_newest_version(builtin: None) -> None:
    out, _ = run("export", "tire_burst")
    assert out == dump_definition(builtin_definition("tire_burst"))


def _write(tmp_path: Path, definition: dict[str, Any], name: str = "scenario.yaml") -> Path:
    path = tmp_path / name
    path.write_text(dump_definition(definition), encoding="utf-8")
    return path


def test_a_bad_file_changes_nothing_and_names_each_error_with_its_line(
    builtin: None, tmp_path: Path
) -> None:
    definition = copy.deepcopy(builtin_definition("bird_strike"))
    definition["risk_rules"][2]["when"] = {"bird_sise": "LARGE"}
    definition["actions"][3]["risk_class"] = "R5"
    definition["report_template"]["en"] = "# Report\n{% for a in actions %}{{ a.tool }}\n"
    path = _write(tmp_path, definition)
    lines = path.read_text(encoding="utf-8").splitlines()
    before = assemble(Scenario.objects.get(slug="bird_strike"))[0]
    audits = AuditLog.objects.count()

    _, err, error = run_failing("import", str(path))

    assert error == f"{path}: The file is not a valid scenario. Nothing was changed."
    problems = err.splitlines()
    assert len(problems) == 3
    line_of = {}
    for problem in problems:
        assert problem.startswith(f"{path}: line ")
        line, _, rest = problem[len(f"{path}: line ") :].partition(": ")
        line_of[rest] = int(line)
    assert set(line_of) == {
        "risk_rules[2].when.bird_sise: unknown field 'bird_sise'",
        "report_template.en: does not compile: Unclosed tag on line 2: 'for'. Looking for "
        "one of: empty, endfor.",
        "actions[3].risk_class: 'R5' is not one of R0-R3",
    }
    for rest, number in line_of.items():
        key = rest.split(":")[0].rsplit(".", 1)[-1]
        assert key in lines[number - 1]
    assert assemble(Scenario.objects.get(slug="bird_strike"))[0] == before
    assert AuditLog.objects.count() == audits


def test_a_file_that_is_not_yaml(builtin: None, tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("slug: x\nname: {zh: a, en: b\n", encoding="utf-8")

    _, err, error = run_failing("import", str(path))

    assert err.startswith(f"{path}: line 3: (file): not valid YAML")
    assert error == f"{path}: The file is not valid YAML. Nothing was changed."


def test_import_and_publish_a_new_version(builtin: None, tmp_path: Path, make_user: Any) -> None:
    make_user("ada")
    definition = copy.deepcopy(builtin_definition("tire_burst"))
    definition["risk_rules"][3]["score"] = 65
    path = _write(tmp_path, definition)

    out, _ = run("import", str(path), "--publish", "--author", "ada")

    assert out == "tire_burst: draft replaced\ntire_burst: published v2\n"
    version = ScenarioVersion.objects.get(scenario__slug="tire_burst", number=2)
    assert version.published_by is not None and version.published_by.username == "ada"
    assert version.definition["risk_rules"][3]["score"] == 65
    entry = AuditLog.objects.filter(action="scenario.published").first()
    assert entry is not None
    assert (entry.actor_label, entry.detail["version"], entry.detail["previous"]) == ("ada", 2, 1)

    out, _ = run("import", str(path), "--publish")
    assert out == "tire_burst: draft replaced\ntire_burst: unchanged, v2 is current\n"
    assert versions("tire_burst") == [1, 2]


def test_publishing_a_file_whose_cases_fail_changes_nothing(builtin: None, tmp_path: Path) -> None:
    definition = copy.deepcopy(builtin_definition("tire_burst"))
    # Valid, but the policy no longer does what the example cases expect.
    definition["actions"][5]["when"] = {}  # tow every time, even at the stand
    path = _write(tmp_path, definition)

    _, err, error = run_failing("import", str(path), "--publish")

    assert error == (
        f"{path}: The scenario's example cases fail, so it cannot be published. "
        "Nothing was changed."
    )
    assert f"{path}: example 1 (CA1234 在105机位爆胎，轮胎起火冒烟，无碎片): actions: " in err
    assert versions("tire_burst") == [1]
    assert assemble(Scenario.objects.get(slug="tire_burst"))[0]["actions"][5]["when"] == {
        "phase": {"not": "STAND"}
    }


def test_import_creates_a_new_scenario(builtin: None, tmp_path: Path) -> None:
    definition = copy.deepcopy(builtin_definition("tire_burst"))
    definition["slug"] = "wheel_fire"
    definition["name"] = {"zh": "机轮起火", "en": "Wheel fire"}
    path = _write(tmp_path, definition)

    out, _ = run("import", str(path), "--publish")

    assert out == "wheel_fire: draft created\nwheel_fire: published v1\n"
    assert Scenario.objects.get(slug="wheel_fire").name_en == "Wheel fire"


# --- the built-in loader ------------------------------------------------------------------


def test_the_loader_is_idempotent(builtin: None) -> None:
    assert load_builtin_data() == []
    assert load_builtin_data(update=True) == []
    for slug in ("oil_spill", "bird_strike", "tire_burst"):
        assert versions(slug) == [1]
        scenario = Scenario.objects.get(slug=slug)
        definition, issues = assemble(scenario)
        assert issues == []
        assert definition == scenario.latest_version().definition  # type: ignore[union-attr]


def test_the_loader_fills_a_missing_draft_from_the_newest_version(builtin: None) -> None:
    scenario = Scenario.objects.get(slug="oil_spill")
    for rows in ("draft_fields", "draft_values", "draft_rules", "draft_actions"):
        getattr(scenario, rows).all().delete()

    assert load_builtin_data() == ["scenario oil_spill: draft filled from v1"]
    assert assemble(scenario)[0] == scenario.latest_version().definition  # type: ignore[union-attr]


@pytest.fixture
def changed_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the built-in data where bird_strike's BS-03 scores 61 instead of 60."""
    shutil.copytree(builtin.DATA_DIR, tmp_path / "data")
    path = tmp_path / "data" / "scenarios" / "bird_strike.yaml"
    path.write_text(
        path.read_text(encoding="utf-8").replace(
            "level: MEDIUM, score: 60", "level: MEDIUM, score: 61"
        ),
        encoding="utf-8",
    )
    monkeypatch.setattr(builtin, "DATA_DIR", tmp_path / "data")
    return path


def test_update_publishes_a_changed_built_in_file(builtin: None, changed_files: Path) -> None:
    assert load_builtin_data() == []  # without --update nothing changes
    assert load_builtin_data(update=True) == ["scenario bird_strike: published v2"]
    assert RiskRule.objects.get(scenario__slug="bird_strike", rule_id="BS-03").score == 61


def test_update_never_overwrites_an_admins_draft(builtin: None, changed_files: Path) -> None:
    RiskRule.objects.filter(scenario__slug="bird_strike", rule_id="BS-04").update(score=55)

    assert load_builtin_data(update=True) == [
        "scenario bird_strike: kept (the draft has unpublished admin edits)"
    ]
    assert versions("bird_strike") == [1]
    assert RiskRule.objects.get(scenario__slug="bird_strike", rule_id="BS-04").score == 55


def test_update_never_overwrites_an_admins_version(
    builtin: None, changed_files: Path, make_user: Any
) -> None:
    from scenarios_admin.actions import do_publish

    RiskRule.objects.filter(scenario__slug="bird_strike", rule_id="BS-04").update(score=55)
    do_publish(Scenario.objects.get(slug="bird_strike"), user=make_user("ada"))

    assert load_builtin_data(update=True) == [
        "scenario bird_strike: kept v2 (published by an admin)"
    ]
    assert versions("bird_strike") == [1, 2]
