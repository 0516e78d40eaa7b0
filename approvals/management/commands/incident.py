"""Headless incident runs for scripts: the same job path as the web, run in this process."""

from __future__ import annotations

import json
import time
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connection
from django.db.migrations.executor import MigrationExecutor

from aero.packs import UnknownDomain, file_pack, pack_for
from aero.roles import APPROVER, OPERATOR, ensure_role_groups
from approvals.actions import APPROVE, CONFIRM, REJECT, do_decide
from approvals.models import OPEN_STATUSES, Approval, ApprovalStatus
from diagnosis.actions import ActionError, do_answer, do_create_session
from diagnosis.jobs import advance_session
from diagnosis.models import Session, SessionStatus
from scenarios_admin.models import Scenario

# How long the command waits for another process (a worker of `make run`) that holds
# the session before it prints what it has.
HELD_ELSEWHERE_SECONDS = 120

CLI_USER = "cli"


class Command(BaseCommand):
    help = "Run incident sessions from the command line."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        run = sub.add_parser("run", help="Run one session to its end or its first unanswered wait.")
        run.add_argument("--scenario", help="Scenario slug, e.g. oil_spill.")
        run.add_argument("--message", help="The incident description.")
        run.add_argument(
            "--bundle",
            help="An incident bundle (folder, .zip or .tar.gz): opens a session of the pack "
            "that reads evidence files (IT diagnosis) instead of --scenario/--message.",
        )
        run.add_argument(
            "--mode",
            choices=["react", "plan_execute", "hierarchical"],
            help="Preferred run mode of a --bundle session.",
        )
        run.add_argument(
            "--metrics-source",
            default="",
            help="Read a --bundle session's metrics from this configured metrics source "
            "(a Prometheus, admin: metrics sources) instead of the bundle's metrics.csv.",
        )
        run.add_argument(
            "--sources",
            choices=["bundle", "system"],
            default="",
            help="Where an IT diagnosis reads its evidence: the --bundle's files (the "
            "default), or the sources an admin attached to the system (its metrics source "
            "and its code's git server); with system, --bundle may be left out (then give "
            "--message, and --since/--until for the incident's window).",
        )
        run.add_argument(
            "--since",
            default="",
            help="With --sources system and no --bundle: "
            "the incident window's start (ISO 8601 with its offset).",
        )
        run.add_argument(
            "--until",
            default="",
            help="With --sources system and no --bundle: "
            "the window's end and the report time (default: now).",
        )
        run.add_argument(
            "--answer",
            action="append",
            default=[],
            help="An answer to the agent's next question (repeatable, in order).",
        )
        run.add_argument(
            "--decide",
            choices=[APPROVE, REJECT],
            help="Decide every approval (both confirmations where two are needed).",
        )
        run.add_argument("--reason", default="", help="Reason recorded with the decisions.")
        run.add_argument("--json", action="store_true", help="Print one JSON object.")

    def handle(self, *args: Any, **options: Any) -> None:
        _require_migrated()
        # Jobs run here, in this process, through the same advance_session as workers.
        settings.AERO_JOB_BACKEND = "inline"
        # And their model calls, inside the job (not as waits): with `make run` up on the
        # same database its runner claimed the waits and the command ended "running",
        # its decisions never made.
        settings.AERO_LLM_WAITS = False
        if options["decide"] and not options["reason"].strip():
            # Rejections and R3 confirmations need a written reason; say where it came from.
            options["reason"] = {APPROVE: "approved", REJECT: "rejected"}[
                options["decide"]
            ] + " from the command line"
        if options["bundle"] or options["sources"]:
            self._run_file(options)
            return
        if options["scenario"] is None or options["message"] is None:
            raise CommandError("give --scenario and --message, or --bundle")
        scenario = Scenario.objects.filter(slug=options["scenario"]).first()
        if scenario is None:
            known = ", ".join(Scenario.objects.values_list("slug", flat=True)) or "none loaded"
            raise CommandError(f"unknown scenario {options['scenario']!r} (known: {known})")
        try:
            summarize = pack_for(scenario.kind).summarize
        except UnknownDomain as exc:
            raise CommandError(str(exc)) from exc
        if summarize is None:
            raise CommandError(f"{scenario.slug}: its pack prints no session summary")
        user = _cli_user()
        try:
            session = do_create_session(user, scenario, options["message"], producer="cli")
            self._drive(
                session, user, list(options["answer"]), options["decide"], options["reason"]
            )
        except ActionError as exc:
            raise CommandError(str(exc)) from exc
        session.refresh_from_db()
        result = summarize(session)
        if options["json"]:
            self.stdout.write(json.dumps(result, ensure_ascii=False, sort_keys=True))
        else:
            self._print(result)

    def _run_file(self, options: dict[str, Any]) -> None:
        """A session opened from an evidence file by the pack that reads them, run to its
        end (or its first unanswered wait) and printed as that pack summarizes it."""
        try:
            pack = file_pack()
        except UnknownDomain as exc:
            raise CommandError(str(exc)) from exc
        assert pack.start_from_file is not None and pack.summarize is not None
        user = _cli_user()
        try:
            session = pack.start_from_file(
                user,
                options["bundle"] or None,
                {
                    "producer": "cli",
                    "description": options["message"] or "",
                    "preferred_mode": options["mode"] or "",
                    "metrics_source": options["metrics_source"],
                    "sources": options["sources"] or "bundle",
                    "since": options["since"],
                    "until": options["until"],
                },
            )
            self._drive(
                session, user, list(options["answer"]), options["decide"], options["reason"]
            )
        except ActionError as exc:
            raise CommandError(str(exc)) from exc
        session.refresh_from_db()
        result = pack.summarize(session)
        if options["json"]:
            self.stdout.write(json.dumps(result, ensure_ascii=False, sort_keys=True))
        else:
            for key, value in result.items():
                self.stdout.write(f"{key}: {json.dumps(value, ensure_ascii=False)}")

    def _drive(
        self, session: Session, user: Any, answers: list[str], decide: str | None, reason: str
    ) -> None:
        while True:
            self._advance(session)
            if session.status != SessionStatus.WAITING_USER:
                return
            question = session.snapshot.get("question") or {}
            if question and answers:
                do_answer(session.pk, user, answers.pop(0), producer="cli")
                continue
            if question and not question.get("optional"):
                return
            # An optional question is asked alongside the approvals: left unanswered,
            # the decisions go on and the session completes without it.
            pending = list(Approval.objects.filter(session=session, status__in=OPEN_STATUSES))
            if not pending or decide is None:
                return
            for approval in pending:
                while approval.is_open:
                    step = decide
                    if decide == APPROVE and approval.status == ApprovalStatus.CONFIRMING:
                        step = CONFIRM  # the second, explicit confirmation of an R2
                    approval = do_decide(
                        approval.pk, user, step, reason, digest=approval.digest, producer="cli"
                    )

    def _advance(self, session: Session) -> None:
        """Advance the session here, or wait for the process that holds it: beside
        `make run` on the same database its worker's reconciler can take the session
        first, and the command printed "running" with its decisions never made."""
        deadline = time.monotonic() + HELD_ELSEWHERE_SECONDS
        while True:
            outcome = advance_session(str(session.pk))  # a no-op if the job already ran
            session.refresh_from_db()
            held = outcome == "busy" or session.status in (
                SessionStatus.QUEUED,
                SessionStatus.RUNNING,
                SessionStatus.RETRYING,
            )
            if not held or time.monotonic() > deadline:
                return
            time.sleep(0.2)

    def _print(self, result: dict[str, Any]) -> None:
        self.stdout.write(f"session {result['session']}: {result['status']}")
        for question in result["questions"]:
            self.stdout.write(f"  asked: {question}")
        for name, value in result["fields"].items():
            self.stdout.write(f"  {name} = {value}")
        if result["risk"]:
            risk = result["risk"]
            self.stdout.write(f"  risk {risk['level']} {risk['score']} ({risk['rule']})")
        for action in result["actions"]:
            self.stdout.write(
                f"  {action['risk_class']} {action['tool']} {action['args']} -> "
                f"{action['decision']}/{action['status']}"
            )
        if result["report_markdown"]:
            self.stdout.write("")
            self.stdout.write(result["report_markdown"])


def _require_migrated() -> None:
    try:
        executor = MigrationExecutor(connection)
        plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    except DatabaseError as exc:
        raise CommandError(f"database unavailable: {exc}".splitlines()[0]) from exc
    if plan:
        raise CommandError(
            "the database is not migrated: run `make run` once "
            "(or `python manage.py migrate && python manage.py load_builtin`)"
        )


def _cli_user() -> Any:
    ensure_role_groups()
    user, created = get_user_model().objects.get_or_create(
        username=CLI_USER, defaults={"first_name": "Command line"}
    )
    if created:
        user.set_unusable_password()
        user.save()
    from django.contrib.auth.models import Group

    user.groups.add(*Group.objects.filter(name__in=[OPERATOR, APPROVER]))
    return user
