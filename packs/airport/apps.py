from __future__ import annotations

from typing import Any

from django.apps import AppConfig


class AirportPackConfig(AppConfig):
    """The airport apron emergency domain (scenario kind "apron")."""

    name = "packs.airport"
    label = "airport"
    verbose_name = "Airport apron"

    def ready(self) -> None:
        from aero.packs import ActionTool, DomainPack, ToolRegistry, register
        from diagnosis import external
        from diagnosis.agent.graph import build_graph
        from diagnosis.agent.tools import action_request, action_result
        from diagnosis.jobs.world import load_world
        from packs.airport.definition import ApronDefinition
        from scenarios_admin.definition import ACTION_TOOLS, RISK_FLOORS

        actions = {
            name: ActionTool(
                name=name,
                risk_floor=RISK_FLOORS[name],
                system=external.SYSTEM_OF[name],
                request=action_request,
                result=action_result,
            )
            for name in ACTION_TOOLS
        }
        register(
            DomainPack(
                kind="apron",
                app_label=self.label,
                label={"zh": "机坪应急", "en": "Apron emergency"},
                definition_model=ApronDefinition,
                tools=ToolRegistry(actions=actions),
                graph=build_graph,
                initial_state=initial_state,
                world=load_world,
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
