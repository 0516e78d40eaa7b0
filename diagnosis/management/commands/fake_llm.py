from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from diagnosis.agent.fake_llm import FakeLLMServer, Script


class Command(BaseCommand):
    help = (
        "Run the simulated OpenAI-compatible server (tests, demos, benchmarks): "
        "/v1/chat/completions and /v1/models, replies and faults from a YAML/JSON script."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, default=8765)
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--script", help="YAML or JSON script of replies and faults.")
        parser.add_argument(
            "--latency", type=float, help="Seconds before every reply (overrides the script)."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            script = Script.load(options["script"]) if options["script"] else Script.parse({})
        except (OSError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        if options["latency"] is not None:
            script.latency = options["latency"]
        try:
            server = FakeLLMServer(script, host=options["host"], port=options["port"])
        except OSError as exc:
            raise CommandError(
                f"cannot listen on {options['host']}:{options['port']}: {exc}"
            ) from exc
        self.stdout.write(
            f"fake LLM on http://{options['host']}:{server.port}/v1 "
            f"({len(script.rules)} rule(s), models {', '.join(script.models)}); Ctrl-C stops"
        )
        self.stdout.flush()  # the banner is how a parent process knows it is up
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.stopping.set()
            server.httpd.server_close()
