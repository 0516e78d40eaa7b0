from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from scenarios_admin.builtin import BuiltinDataError, load_builtin_data


class Command(BaseCommand):
    help = "Load the built-in data: each pack's world and the scenarios (idempotent)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--update",
            action="store_true",
            help="Publish a new version of a built-in scenario whose file changed.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            done = load_builtin_data(update=options["update"])
        except BuiltinDataError as exc:
            raise CommandError(str(exc)) from exc
        for line in done or ["built-in data already present"]:
            self.stdout.write(line)
