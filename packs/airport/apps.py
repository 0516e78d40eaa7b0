from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.utils.translation import gettext_lazy

# The admin's changes to the world, named for auditors (aero.audit_trail).
ADMIN_ACTIONS = {
    "airport.topology": ("topology.created", "topology.changed", "topology.deleted"),
    "airport.flight": ("flight.created", "flight.changed", "flight.deleted"),
}


class AirportPackConfig(AppConfig):
    """The airport apron emergency domain (scenario kind "apron")."""

    name = "packs.airport"
    label = "airport"
    verbose_name = "Airport apron"

    def ready(self) -> None:
        from aero import serving
        from aero.packs import DomainPack, ToolRegistry, register
        from diagnosis import external
        from diagnosis.agent.tools import register_lookups
        from diagnosis.consequences import register_plain_words
        from diagnosis.eventlog.registry import register as register_events
        from diagnosis.eventlog.registry import register_finding
        from diagnosis.eventlog.types.session import register_timeline_kind
        from diagnosis.wording import register_node_kind_labels, register_tool_labels
        from packs.airport import actions, findings, lookups, rows, words, yaml_order
        from packs.airport.admin_rows import ROW_INLINES
        from packs.airport.agent.prompts import REACT
        from packs.airport.agent.reading import READING
        from packs.airport.agent.selfcheck import check_draft
        from packs.airport.arguments import ANALYSES
        from packs.airport.definition import ApronDefinition
        from packs.airport.models import Restriction, Topology
        from packs.airport.pages import page_world
        from packs.airport.seed import seed_world
        from packs.airport.summary import summarize
        from packs.airport.world import connect_signals, load_active_graph

        for system, prefix in actions.SYSTEMS.items():
            external.register_system(system, prefix)
        register_finding(*findings.KINDS)
        register_events(*findings.LEGACY_TYPES)
        register_tool_labels(actions.LABELS)
        register_tool_labels(words.TOOL_LABELS)
        register_plain_words(words.PLAIN)
        register_node_kind_labels(words.NODE_KINDS)
        register_lookups(lookups.LOOKUPS, lookups.FAILURES)
        connect_signals()
        register_timeline_kind(
            "enrichment",
            gettext_lazy("Flight and position looked up"),
            f"{findings.LINES}#enrichment",
        )
        serving.add_page_sockets(board_sockets)
        register(
            DomainPack(
                kind="apron",
                app_label=self.label,
                label={"zh": "机坪应急", "en": "Apron emergency"},
                definition_model=ApronDefinition,
                tools=ToolRegistry(
                    actions=actions.action_tools(),
                    lookups=lookups.LOOKUPS,
                    analyses=ANALYSES,
                    failures=lookups.FAILURES,
                    argument_words=actions.ARGUMENT_WORDS,
                    target_args=actions.TARGET_ARGS,
                ),
                graph=build_graph,
                initial_state=initial_state,
                world=load_active_graph,
                world_stamp=Topology,
                seed_world=seed_world,
                admin_actions={
                    "airport.topology": (
                        "topology.created",
                        "topology.changed",
                        "topology.deleted",
                    ),
                    "airport.flight": ("flight.created", "flight.changed", "flight.deleted"),
                },
                reading=READING,
                react_prompt=REACT,
                check_draft=check_draft,
                draft_rows=rows.DRAFT_ROWS,
                draft_definition=rows.definition_parts,
                definition_draft=rows.draft_parts,
                place_draft_issue=rows.place_issue,
                canonical_parts=yaml_order.canonical_parts,
                row_inlines=ROW_INLINES,
                row_help_template="airport/_row_help.html",
                moved_admin={
                    "diagnosis.restriction": "airport.restriction",
                    "scenarios_admin.topology": "airport.topology",
                    "scenarios_admin.flight": "airport.flight",
                },
                enrichment_warning=lookups.stand_mismatch_text,
                page_world=page_world,
                facts_template="airport/_facts.html",
                replay_facts_template="airport/_replay_facts.html",
                card_template="airport/_card.html",
                export_template="airport/export.md",
                history_filters=words.HISTORY_FILTERS,
                restrictions=Restriction,
                summarize=summarize,
                urls="packs.airport.urls",
                nav=((gettext_lazy("Airport status"), "airport:board"),),
            )
        )


def build_graph() -> Any:
    """The apron graph, imported by the job that compiles it: a web process, which only
    registers it, starts without LangGraph (~1.3 s of CPU)."""
    from packs.airport.agent.graph import build_graph as build

    return build()


def board_sockets() -> list[Any]:
    """The board's socket, imported when the web server builds its routes."""
    from packs.airport.consumers import board_sockets as sockets

    return sockets()


def initial_state(session: Any, definition: dict[str, Any]) -> dict[str, Any]:
    """A new apron session: nothing read yet, in the first compliance state."""
    return {
        "session_id": str(session.pk),
        "language": session.language,
        "consumed_seq": 0,
        "fsm": definition["compliance"]["states"][0],
    }
