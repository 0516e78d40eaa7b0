"""State changes of scenarios: publish a draft, import and export YAML files."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils.translation import gettext as _

from aero.models import audit
from aero.packs import edited_as_yaml
from scenarios_admin.draft import assemble, draft_from_definition, save_draft, save_yaml_draft
from scenarios_admin.models import Scenario, ScenarioVersion
from scenarios_admin.schema import definition_issues
from scenarios_admin.signals import publish_check
from scenarios_admin.yamlio import LocatedIssue, dump_definition, load_yaml, locate


class ScenarioError(Exception):
    """A refused change, with every reason."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.problems = problems or []


class NothingToPublish(ScenarioError):
    pass


class ImportRefused(ScenarioError):
    def __init__(self, message: str, issues: list[LocatedIssue]) -> None:
        super().__init__(message, [str(issue) for issue in issues])
        self.issues = issues


def run_publish_checks(definition: dict[str, Any]) -> list[str]:
    responses = publish_check.send(sender=Scenario, definition=definition)
    if not responses:
        # Fail closed: a version is never published without its self-check.
        return ["no self-check is installed (the diagnosis app registers it)"]
    failures: list[str] = []
    for _receiver, response in responses:
        failures.extend(list(response or []))
    return failures


def draft_status(scenario: Scenario) -> tuple[ScenarioVersion | None, bool]:
    """The newest published version and whether the draft differs from it."""
    latest = scenario.latest_version()
    definition, _ = assemble(scenario)
    changed = latest is None or latest.checksum != ScenarioVersion.checksum_of(definition)
    return latest, changed


def do_publish(
    scenario: Scenario, *, user: Any = None, actor_label: str = "", note: str = ""
) -> ScenarioVersion:
    """Freeze the draft as the next version: validated, self-checked, audited. Locks the
    scenario row, so two publishers get consecutive numbers. Raises ScenarioError (the
    newest version keeps serving) or NothingToPublish."""
    with transaction.atomic():
        scenario = Scenario.objects.select_for_update().get(pk=scenario.pk)
        definition, issues = assemble(scenario)
        if issues:
            raise ScenarioError(
                _("The draft is not valid, so it cannot be published."), [str(i) for i in issues]
            )
        failures = run_publish_checks(definition)
        if failures:
            raise ScenarioError(
                _("The scenario's example cases fail, so it cannot be published."), failures
            )
        latest = scenario.latest_version()
        if latest is not None and latest.checksum == ScenarioVersion.checksum_of(definition):
            raise NothingToPublish(
                _("The draft is the same as version %(n)s.") % {"n": latest.number}
            )
        version = ScenarioVersion.objects.create(
            scenario=scenario,
            number=(latest.number + 1) if latest else 1,
            definition=definition,
            published_by=user if getattr(user, "is_authenticated", False) else None,
            note=note[:200],
        )
        audit(
            "scenario.published",
            obj=version,
            actor=user,
            actor_label=actor_label,
            detail={
                "slug": scenario.slug,
                "version": version.number,
                "previous": latest.number if latest else None,
                "checksum": version.checksum,
                "note": version.note,
            },
        )
    return version


@dataclass
class ImportResult:
    scenario: Scenario
    created: bool
    version: ScenarioVersion | None
    unchanged: bool  # --publish found the draft equal to the newest version


def parse_scenario_file(text: str) -> dict[str, Any]:
    """The definition in a YAML file; raises ImportRefused with every problem located."""
    data, problems = load_yaml(text)
    if problems:
        raise ImportRefused("The file is not valid YAML.", problems)
    issues = definition_issues(data)
    if issues:
        raise ImportRefused("The file is not a valid scenario.", locate(issues, text))
    assert isinstance(data, dict)
    return data


def do_import(
    text: str,
    *,
    source: str,
    user: Any = None,
    actor_label: str = "",
    publish: bool = False,
    note: str = "",
) -> ImportResult:
    """Replace (or create) a scenario's draft from a YAML file, validated like an admin
    save; with `publish`, publish it too. All or nothing: a bad file, or a draft whose
    example cases fail when publishing, changes nothing."""
    definition = parse_scenario_file(text)
    with transaction.atomic():
        scenario = Scenario.objects.select_for_update().filter(slug=definition["slug"]).first()
        created = scenario is None
        if scenario is None:
            scenario = Scenario.objects.create(
                slug=definition["slug"],
                name_zh=definition["name"]["zh"],
                name_en=definition["name"]["en"],
                kind=definition["kind"],
            )
        if edited_as_yaml(scenario.kind):
            save_yaml_draft(scenario, definition)
        else:
            save_draft(scenario, draft_from_definition(definition))
        audit(
            "scenario.imported",
            obj=scenario,
            actor=user,
            actor_label=actor_label,
            detail={"slug": scenario.slug, "source": source, "created": created},
        )
        version, unchanged = None, False
        if publish:
            try:
                version = do_publish(
                    scenario, user=user, actor_label=actor_label, note=note or f"import {source}"
                )
            except NothingToPublish:
                unchanged = True
    return ImportResult(scenario, created, version, unchanged)


def export_text(scenario: Scenario, version: int | None = None, *, draft: bool = False) -> str:
    """The YAML file of a published version (default: the newest) or of the draft."""
    if draft:
        definition, issues = assemble(scenario)
        if issues:
            raise ScenarioError(
                _("The draft is not valid, so it cannot be exported."), [str(i) for i in issues]
            )
        return dump_definition(definition)
    chosen = (
        scenario.versions.filter(number=version).first()
        if version is not None
        else scenario.latest_version()
    )
    if chosen is None:
        raise ScenarioError(
            _("%(slug)s has no version %(n)s.") % {"slug": scenario.slug, "n": version}
            if version is not None
            else _("%(slug)s has no published version (export the draft instead).")
            % {"slug": scenario.slug}
        )
    return dump_definition(chosen.definition)
