from __future__ import annotations

from typing import Any

from django.apps import AppConfig


class DiagnosisConfig(AppConfig):
    name = "diagnosis"
    verbose_name = "Incident sessions"

    def ready(self) -> None:
        # Every event type this app writes, declared before anything folds or appends.
        from diagnosis.eventlog.types import declare

        declare()
        # The audit log shows a read-only viewer entries' details masked by the same rule.
        from aero.audit_views import register_detail_mask
        from diagnosis.eventlog.masking import audit_mask_for

        register_detail_mask(audit_mask_for)
        # An audited decision's tool and arguments in the reader's words.
        from aero.audit_words import register_value_words
        from diagnosis.wording import audit_args_words, audit_tool_words

        register_value_words("tool", audit_tool_words)
        for key in ("args", "before", "after"):
            register_value_words(key, audit_args_words)
        from diagnosis.jobs import (
            close_orphaned_runs,
            delete_ended_checkpoints,
            prune_waiting_checkpoints,
            requeue_stalled_sessions,
            resume_failed_sessions,
        )
        from diagnosis.lifts import resume_pending_lifts
        from diagnosis.llm_runner import prune_requests
        from diagnosis.maintenance import register

        register("requeue-stalled-sessions", requeue_stalled_sessions)
        register("resume-failed-sessions", resume_failed_sessions)
        register("close-orphaned-runs", close_orphaned_runs)
        register("delete-ended-checkpoints", delete_ended_checkpoints)
        register("prune-waiting-checkpoints", prune_waiting_checkpoints)
        register("prune-llm-requests", prune_requests)
        # A lift has no session job to finish it: the web processes sweep too.
        register("resume-pending-lifts", resume_pending_lifts, web=True)
        # Expired sign-ins (and signed-out drafts): web too, so embedded mode runs it.
        from aero.sessions import clear_expired_sessions

        register("clear-expired-sessions", clear_expired_sessions, web=True)

        # scenarios_admin may not import this app: the runtime that can run a scenario's
        # example cases registers the publish-time self-check with it.
        from diagnosis.selfcheck import publish_check as run_self_check
        from scenarios_admin.signals import publish_check

        publish_check.connect(run_self_check, dispatch_uid="diagnosis.selfcheck")

        # A sign-out closes the page sockets opened with that sign-in.
        from django.contrib.auth.signals import user_logged_out

        from diagnosis.push import notify_signed_out

        user_logged_out.connect(notify_signed_out, dispatch_uid="diagnosis.signed-out")

        # The kernel names no app: this one adds its sockets, health probes and what a
        # web process starts with.
        from aero import db_owner, health, serving
        from diagnosis import checkpoint_tables
        from diagnosis import health as beats
        from diagnosis.startup import web_started

        db_owner.register(checkpoint_tables.create)  # LangGraph's: made by the owner
        serving.add_page_sockets(session_sockets)
        serving.on_start(web_started)
        health.register("workers", beats.workers, when=beats.workers_checked)
        health.register("llm_runner", beats.llm_runners, when=beats.runners_checked)


def session_sockets() -> list[Any]:
    from diagnosis.routing import websocket_urlpatterns

    return websocket_urlpatterns
