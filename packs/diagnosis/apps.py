from __future__ import annotations

from typing import Any

from django.apps import AppConfig


def api_router() -> Any:
    # imported when the API's urls load, not at ready(): the API's modules need the apps
    from packs.diagnosis.api import router

    return router


# The graph and the specialists' runner are imported by the job that runs them: a web
# process (which only registers them) starts without LangGraph (~1.3 s of CPU).
def build_graph() -> Any:
    from packs.diagnosis.graph import build_graph as build

    return build()


def run_specialist(*args: Any, **kwargs: Any) -> Any:
    from packs.diagnosis.specialists import run_specialist as run

    return run(*args, **kwargs)


def initial_state(session: Any, definition: dict[str, Any]) -> dict[str, Any]:
    """A new diagnosis session: nothing read yet."""
    return {"session_id": str(session.pk), "language": session.language, "consumed_seq": 0}


class DiagnosisPackConfig(AppConfig):
    """IT problem diagnosis (scenario kind "diagnosis"): incident bundles, evidence tools,
    the offline playbook, fixes under approval (DIAGNOSIS.md)."""

    name = "packs.diagnosis"
    label = "diagnosis_pack"
    verbose_name = "IT problem diagnosis"

    def ready(self) -> None:
        from aero.packs import DomainPack, ToolRegistry, register
        from diagnosis import external
        from diagnosis.agent.child_agents import register_child_agent
        from diagnosis.eventlog.registry import register as register_events
        from diagnosis.eventlog.registry import register_finding
        from diagnosis.wording import (
            register_agent_labels,
            register_result_words,
            register_summary_words,
            register_tool_labels,
        )
        from packs.diagnosis import (
            fixes,
            modes,
            sessions,
            skill_calls,
            slow,
            sources,
            web,
            words,
        )
        from packs.diagnosis.definition import DiagnosisDefinition
        from packs.diagnosis.findings import KINDS
        from packs.diagnosis.report import export_context, report_fields
        from packs.diagnosis.seed import builtin_definition, seed
        from packs.diagnosis.selfcheck import check_examples
        from packs.diagnosis.storage import delete_bundle
        from packs.diagnosis.system import demo_shop
        from packs.diagnosis.tool_args import EVIDENCE_ARGS

        external.register_system(fixes.SHOP_OPS, fixes.SHOP_OPS_PREFIX)
        sources.connect_audit()
        slow.register()  # its slow tools: waits the LLM runner answers
        # Its specialists: child agents with jobs of their own.
        register_child_agent(modes.SPECIALIST_KIND, run_specialist)
        skill_calls.register()
        register_finding(*KINDS)
        register_events(*sessions.EVENT_TYPES, *modes.EVENT_TYPES)
        register_tool_labels({**fixes.LABELS, **sessions.EVIDENCE_LABELS})
        # What an evidence call found, worded per reader from its result (timeline, replay).
        register_result_words(sessions.EVIDENCE_LABELS, words.evidence_summary)
        register_summary_words(words.step_summary)
        register_agent_labels(modes.STEP_LABELS)
        register(
            DomainPack(
                kind="diagnosis",
                app_label=self.label,
                label={"zh": "IT 故障诊断", "en": "IT problem diagnosis"},
                definition_model=DiagnosisDefinition,
                tools=ToolRegistry(
                    actions=fixes.action_tools(),
                    evidence=tuple(sessions.EVIDENCE_LABELS),
                    argument_words=fixes.ARGUMENT_WORDS,
                    evidence_args=EVIDENCE_ARGS,
                ),
                graph=build_graph,
                initial_state=initial_state,
                world=lambda stamp: demo_shop(),
                opens_from_message=False,
                seed=seed,
                start_from_file=sessions.start_from_bundle,
                summarize=sessions.summarize,
                report_fields=report_fields,
                export_template="diagnosis_pack/export.md",
                export_context=export_context,
                page_panel="diagnosis_pack/_panel.html",
                page_context=web.page_context,
                replay_context=web.replay_context,
                new_session_url="diagnosis_pack:new",
                on_deleted=delete_bundle,
                check_examples=check_examples,
                history_filters=web.HISTORY_FILTERS,
                api_router=api_router,
                admin_editor="yaml",
                admin_actions={
                    "diagnosis_pack.systemsources": (
                        "system_sources.created",
                        "system_sources.changed",
                        "system_sources.deleted",
                    )
                },
                starting_definition=builtin_definition,
            )
        )
