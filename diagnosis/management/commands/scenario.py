"""`manage.py scenario check|export|import`: scenarios as files, and their self-check.

It lives in diagnosis because `check` runs the agent runtime (extraction and policy),
which scenarios_admin may not import; export and import are scenarios_admin's actions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from aero.packs import pack_for
from scenarios_admin.actions import ScenarioError, do_import, export_text
from scenarios_admin.draft import assemble
from scenarios_admin.models import Scenario

ACTOR = "manage.py scenario"


class Command(BaseCommand):
    help = "Check a scenario's example cases, or export / import it as a YAML file."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        check = sub.add_parser("check", help="Run the example cases through the offline provider.")
        check.add_argument("slug")
        check.add_argument(
            "--version", type=int, help="Check this published version (default: the draft)."
        )
        export = sub.add_parser("export", help="Write a scenario as YAML (one file).")
        export.add_argument("slug")
        export.add_argument("--out", help="File to write (default: standard output).")
        which = export.add_mutually_exclusive_group()
        which.add_argument("--version", type=int, help="A published version (default: newest).")
        which.add_argument("--draft", action="store_true", help="The draft, not a version.")
        imp = sub.add_parser("import", help="Replace a scenario's draft from a YAML file.")
        imp.add_argument("file")
        imp.add_argument("--publish", action="store_true", help="Publish it too.")
        imp.add_argument("--author", help="Username recorded as the publisher.")

    def handle(self, *args: Any, **options: Any) -> None:
        getattr(self, "_" + options["action"])(**options)

    def _scenario(self, slug: str) -> Scenario:
        scenario = Scenario.objects.filter(slug=slug).first()
        if scenario is None:
            known = ", ".join(Scenario.objects.values_list("slug", flat=True)) or "none loaded"
            raise CommandError(f"unknown scenario {slug!r} (known: {known})")
        return scenario

    def _check(self, slug: str, version: int | None, **options: Any) -> None:
        scenario = self._scenario(slug)
        own_check = pack_for(scenario.kind).check_examples
        if own_check is not None:
            # The pack runs its own examples on a published version (it edits no draft).
            chosen = (
                scenario.latest_version()
                if version is None
                else scenario.versions.filter(number=version).first()
            )
            if chosen is None:
                raise CommandError(f"{slug} has no version {version or 1}")
            self._report(f"{slug} v{chosen.number}", own_check(chosen.definition))
            return
        if version is None:
            definition, issues = assemble(scenario)
            title = f"{slug} (draft)"
            if issues:
                for issue in issues:
                    self.stderr.write(f"  {issue}")
                raise CommandError(f"{slug}: the draft is not valid ({len(issues)} problems)")
        else:
            chosen = scenario.versions.filter(number=version).first()
            if chosen is None:
                raise CommandError(f"{slug} has no version {version}")
            definition, title = chosen.definition, f"{slug} v{version}"
        check_draft = pack_for(scenario.kind).check_draft
        if check_draft is None:
            raise CommandError(f"{slug}: its pack runs no example cases")
        self._report(title, check_draft(definition))

    def _report(self, title: str, cases: list[Any]) -> None:
        if not cases:
            raise CommandError(f"{title}: no example cases to run")
        self.stdout.write(f"{title}: {len(cases)} example cases")
        for case in cases:
            self.stdout.write(
                f"{'PASS' if case.passed else 'FAIL'} {case.number}: {case.summary()}"
            )
            for problem in case.problems:
                self.stdout.write(f"     - {problem}")
        failed = sum(not case.passed for case in cases)
        self.stdout.write(f"{len(cases) - failed} passed, {failed} failed")
        if failed:
            raise CommandError(f"{title}: {failed} of {len(cases)} example cases failed")

    def _export(
        self, slug: str, out: str | None, version: int | None, draft: bool, **options: Any
    ) -> None:
        try:
            text = export_text(self._scenario(slug), version, draft=draft)
        except ScenarioError as exc:
            for problem in exc.problems:
                self.stderr.write(f"  {problem}")
            raise CommandError(exc.message) from exc
        if out:
            Path(out).write_text(text, encoding="utf-8")
            self.stdout.write(f"{slug}: written to {out}")
        else:
            self.stdout.write(text, ending="")

    def _import(self, file: str, publish: bool, author: str | None, **options: Any) -> None:
        path = Path(file)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(f"{file}: cannot be read: {exc}") from exc
        user = None
        if author:
            user = get_user_model().objects.filter(username=author).first()
            if user is None:
                raise CommandError(f"unknown user {author!r}")
        try:
            result = do_import(
                text,
                source=path.name,
                user=user,
                actor_label="" if user else ACTOR,
                publish=publish,
            )
        except ScenarioError as exc:
            for problem in exc.problems:
                self.stderr.write(f"{file}: {problem}")
            raise CommandError(f"{file}: {exc.message} Nothing was changed.") from exc
        slug = result.scenario.slug
        self.stdout.write(f"{slug}: draft {'created' if result.created else 'replaced'}")
        if result.version is not None:
            self.stdout.write(f"{slug}: published v{result.version.number}")
        elif result.unchanged:
            latest = result.scenario.latest_version()
            self.stdout.write(f"{slug}: unchanged, v{latest.number if latest else 0} is current")
