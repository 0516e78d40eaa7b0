from __future__ import annotations

import uuid
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from diagnosis.chain import verify_chain
from diagnosis.models import Session


class Command(BaseCommand):
    help = (
        "Recompute the event log's hash chain of one session (or of every session, deleted "
        "ones included) and name the first bad seq. Exits non-zero when a chain is broken."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("session", nargs="?", help="A session id; all sessions if omitted.")
        parser.add_argument(
            "--quiet", action="store_true", help="Print only broken chains and the summary."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["session"]:
            try:
                session_id = uuid.UUID(options["session"])
            except ValueError as exc:
                raise CommandError(f"{options['session']!r} is not a session id") from exc
            if not Session.objects.filter(pk=session_id).exists():
                raise CommandError(f"no session {session_id}")
            ids = [session_id]
        else:
            ids = list(Session.objects.order_by("created_at").values_list("pk", flat=True))
        bad = 0
        events = 0
        for session_id in ids:
            report = verify_chain(session_id)
            events += report.checked
            if report.ok:
                if not options["quiet"]:
                    self.stdout.write(
                        f"ok   {report.session_id}  {report.checked} events  head {report.head}"
                    )
                continue
            bad += 1
            self.stdout.write(
                f"BAD  {report.session_id}  first bad seq {report.first_bad_seq}: "
                f"{report.problem}  ({report.checked} events verified before it)"
            )
        summary = f"{len(ids) - bad} of {len(ids)} chain(s) intact, {events} events verified"
        if bad:
            raise CommandError(f"{bad} broken chain(s); {summary}", returncode=2)
        self.stdout.write(summary)
