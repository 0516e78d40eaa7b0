from __future__ import annotations

from typing import Any

from django.apps import AppConfig


class AirportPackConfig(AppConfig):
    """The airport apron emergency domain (scenario kind "apron")."""

    name = "packs.airport"
    label = "airport"
    verbose_name = "Airport apron"

    def ready(self) -> None:
        from aero.packs import DomainPack, ToolRegistry, register
        from diagnosis import external
        from diagnosis.agent.graph import build_graph
        from diagnosis.agent.tools import register_lookups
        from diagnosis.jobs.world import load_world
        from diagnosis.wording import register_tool_labels
        from packs.airport import actions, lookups
        from packs.airport.board import Board
        from packs.airport.definition import ApronDefinition

        for system, prefix in actions.SYSTEMS.items():
            external.register_system(system, prefix)
        register_tool_labels(actions.LABELS)
        register_lookups(lookups.LOOKUPS, lookups.FAILURES)
        register(
            DomainPack(
                kind="apron",
                app_label=self.label,
                label={"zh": "机坪应急", "en": "Apron emergency"},
                definition_model=ApronDefinition,
                tools=ToolRegistry(
                    actions=actions.action_tools(),
                    lookups=lookups.LOOKUPS,
                    failures=lookups.FAILURES,
                    argument_words=actions.ARGUMENT_WORDS,
                    target_args=actions.TARGET_ARGS,
                ),
                graph=build_graph,
                initial_state=initial_state,
                world=load_world,
                enrichment_warning=lookups.stand_mismatch_text,
                board=Board,
            )
        )


def initial_state(session: Any, definition: dict[str, Any]) -> dict[str, Any]:
    """A new apron session: nothing read yet, in the first compliance state."""
    return {
        "session_id": str(session.pk),
        "language": session.language,
        "consumed_seq": 0,
        "fsm": definition["compliance"]["states"][0],
    }
