from __future__ import annotations

from typing import Any

from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"
    verbose_name = "Approvals"

    def ready(self) -> None:
        from approvals import receivers  # noqa: F401  (connects the approval_required hook)
        from approvals.actions import sweep_expired_approvals
        from diagnosis.maintenance import register

        # web=True: the web processes sweep too, so timeouts happen with every worker down.
        register("sweep-expired-approvals", sweep_expired_approvals, web=True)

        from aero import serving

        serving.add_page_sockets(approval_sockets)


def approval_sockets() -> list[Any]:
    from approvals.routing import websocket_urlpatterns

    return websocket_urlpatterns
