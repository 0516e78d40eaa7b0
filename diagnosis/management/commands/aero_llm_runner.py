from __future__ import annotations

import asyncio
import signal
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from diagnosis.jobs import dispatch_after_commit
from diagnosis.llm_runner import Runner


class Command(BaseCommand):
    help = (
        "Run the LLM runner: it makes the model calls sessions wait for, many at "
        "once, and enqueues each session when its reply is stored. One per host, beside "
        "the rq workers; more are safe (each request is claimed with a lease)."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        if not settings.AERO_LLM_WAITS:
            raise CommandError("AERO_LLM_WAITS is off: model calls run inside the jobs")
        if settings.AERO_JOB_BACKEND == "embedded":
            raise CommandError("embedded mode runs the LLM runner inside the web process")
        asyncio.run(self._main())

    async def _main(self) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            # Unfinished calls are released at once, not left to their claim's expiry.
            loop.add_signal_handler(signum, stop.set)
        runner = Runner(enqueue=dispatch_after_commit)
        self.stdout.write(f"LLM runner {runner.name} started")
        await runner.serve(stop)
