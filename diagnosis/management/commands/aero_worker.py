from __future__ import annotations

from typing import Any

import django_rq
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from diagnosis.rq_retry import work_through_outages
from diagnosis.worker import AeroWorker


class Command(BaseCommand):
    help = "Run an AERO background worker (django-rq) on the AERO queue. Start as many as you like."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--burst", action="store_true", help="Exit when the queue is empty.")

    def handle(self, *args: Any, **options: Any) -> None:
        if not settings.REDIS_URL:
            raise CommandError(
                "REDIS_URL is not set: embedded mode runs jobs inside the web process"
            )
        # The priority queue first: rq takes from the first non-empty queue.
        queues = [
            django_rq.get_queue(settings.AERO_PRIORITY_QUEUE),
            django_rq.get_queue(settings.AERO_QUEUE),
        ]
        # A Redis outage does not end the process: it waits for Redis and works on.
        work_through_outages(
            lambda: AeroWorker(queues, connection=queues[0].connection), burst=options["burst"]
        )
