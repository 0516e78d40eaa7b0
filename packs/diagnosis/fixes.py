"""The diagnosis pack's fix actions (DIAGNOSIS.md §3's table), executed by the simulated
shop-operations system through the core's approvals and outbox, and the pack's own
policy on them, checked where they are proposed and again where they execute."""

from __future__ import annotations

from typing import Any

from django.utils import translation
from django.utils.functional import Promise
from django.utils.translation import gettext_lazy as _
from django.utils.translation import pgettext_lazy

from aero.packs import ActionTool
from diagnosis.agent.tools import ToolContext, ToolFailure
from diagnosis.models import ToolCall
from packs.diagnosis.system import System, demo_shop

SHOP_OPS = "shop_ops"  # the simulated shop-operations system (diagnosis.external)
SHOP_OPS_PREFIX = "OPS"

# Each fix: its risk floor (a definition may raise it, never lower it) and its words.
FLOORS = {
    "failover_database": "R3",
    "renew_certificate": "R2",
    "free_disk_space": "R2",
    "restart_service": "R2",
    "rollback_deploy": "R2",
    "revert_config": "R2",
    "open_ticket": "R1",
    "notify_owner": "R1",
}
LABELS: dict[str, Promise] = {
    "failover_database": _("Fail the database over"),
    "renew_certificate": _("Renew the certificate"),
    "free_disk_space": _("Free disk space"),
    "restart_service": _("Restart the service"),
    "rollback_deploy": _("Roll the deploy back"),
    "revert_config": _("Revert the config change"),
    "open_ticket": _("Open a ticket with the owner"),
    "notify_owner": _("Notify the owner"),
}
# What a third party (kind `external`) may get from us: tickets and notices, R1.
EXTERNAL_ONLY = ("open_ticket", "notify_owner")
CHANGING = ("R2", "R3")


def fix_problems(
    tool: str,
    args: dict[str, Any],
    risk_class: str,
    root_cause: dict[str, Any] | None,
    system: System,
) -> list[str]:
    """Why this fix must not be proposed or run: a production change on a service that is
    not the root cause, anything but a ticket or notice for a third party, an unknown
    service."""
    service = str(args.get("service") or "")
    problems = []
    if service not in system.services:
        problems.append(f"{service or 'no service'} is not a service of {system.slug}")
    elif system.kind(service) == "external" and tool not in EXTERNAL_ONLY:
        problems.append(
            f"{service} is a third party: only {' or '.join(EXTERNAL_ONLY)} (R1), not {tool}"
        )
    cause = (root_cause or {}).get("service")
    if risk_class in CHANGING and service != cause:
        problems.append(
            f"an {risk_class} fix runs only on the root cause's service "
            f"({cause or 'none found'}), not {service}"
        )
    return problems


def _request(ctx: ToolContext, tool_call: ToolCall) -> tuple[str, str, dict[str, Any]]:
    system = ctx.graph if isinstance(ctx.graph, System) else demo_shop()
    service = str(tool_call.request_payload.get("service") or "")
    if service not in system.services:
        raise ToolFailure(f"{service} is not a service of {system.slug}")
    return SHOP_OPS, tool_call.tool_name, {"system": system.slug, **tool_call.request_payload}


def _result(ctx: ToolContext, tool_call: ToolCall, remote: dict[str, Any]) -> dict[str, Any]:
    args = tool_call.request_payload
    where = ", ".join(f"{k} {v}" for k, v in args.items())
    with translation.override("en"):  # the log's language
        summary = f"{LABELS[tool_call.tool_name]} ({where})"
    return {"summary": summary, "reference": remote.get("reference", "")}


def _problems(tool_call: ToolCall) -> list[str]:
    root_cause = (tool_call.session.snapshot or {}).get("root_cause")
    call = tool_call
    return fix_problems(
        call.tool_name, call.request_payload, call.risk_class, root_cause, demo_shop()
    )


# The fixes' argument names in words (approval cards and forms label arguments with them).
ARGUMENT_WORDS: dict[str, Promise] = {
    "service": pgettext_lazy("action argument", "service"),
}


def action_tools() -> dict[str, ActionTool]:
    return {
        name: ActionTool(
            name=name,
            risk_floor=floor,
            system=SHOP_OPS,
            request=_request,
            result=_result,
            problems=_problems,
        )
        for name, floor in FLOORS.items()
    }
