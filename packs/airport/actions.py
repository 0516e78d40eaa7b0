"""The airport's response actions, each declared once (aero.packs.ActionTool): its
arguments, risk floor, the system that performs it, what it restricts on the airport
board, its words (label, plain words, result) and how an approver's edit of its
arguments is checked against the airport. The core reaches them by name only."""

from __future__ import annotations

from functools import partial
from typing import Any

from django.utils import translation
from django.utils.functional import Promise
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, pgettext_lazy

from aero.packs import ActionTool
from diagnosis.agent.tools import ToolContext, ToolFailure, dispatch_summary, restriction_summary
from diagnosis.decisions import ActionError, checked_text
from diagnosis.models import ToolCall
from diagnosis.push import notify_board
from packs.airport.arguments import SCHEMAS
from packs.airport.graph import AirportGraph
from packs.airport.models import Restriction
from packs.airport.tower import value_words
from packs.airport.world import load_active_graph

# The external systems the actions reach (diagnosis.external), with their reference prefixes.
AIRPORT_OPS = "airport_ops"
ATC = "atc"
DISPATCH = "dispatch"
SYSTEMS = {AIRPORT_OPS: "AODB", ATC: "ATC", DISPATCH: "DSP"}

# tool -> (argument names, risk floor, system). A scenario may raise the floor, never
# lower it (scenarios_admin.definition.below_floor).
ACTIONS: dict[str, tuple[tuple[str, ...], str, str]] = {
    "notify_atc": (("message",), "R0", ATC),
    "dispatch_cleanup_crew": (("position",), "R1", DISPATCH),
    "request_fire_standby": (("position",), "R1", DISPATCH),
    "suspend_stand_operations": (("stand",), "R2", AIRPORT_OPS),
    "close_taxiway": (("taxiway",), "R2", AIRPORT_OPS),
    "close_runway": (("runway",), "R3", AIRPORT_OPS),
    "runway_inspection": (("runway",), "R1", DISPATCH),
    "fod_sweep": (("position",), "R1", DISPATCH),
    "tow_aircraft": (("flight_no", "position"), "R1", DISPATCH),
}

# The argument names of each action, as scenario definitions write them.
ACTION_ARGS: dict[str, tuple[str, ...]] = {name: spec[0] for name, spec in ACTIONS.items()}

# Actions whose effect is a restriction on the airport board: tool -> (restriction kind,
# the argument naming its target).
RESTRICTING: dict[str, tuple[str, str]] = {
    "suspend_stand_operations": ("stand", "stand"),
    "close_taxiway": ("taxiway", "taxiway"),
    "close_runway": ("runway", "runway"),
}

LABELS: dict[str, Promise] = {
    "notify_atc": gettext_lazy("Notify ATC"),
    "dispatch_cleanup_crew": gettext_lazy("Dispatch the cleanup crew"),
    "request_fire_standby": gettext_lazy("Put the fire brigade on standby"),
    "suspend_stand_operations": gettext_lazy("Suspend stand operations"),
    "close_taxiway": gettext_lazy("Close taxiway"),
    "close_runway": gettext_lazy("Close runway"),
    "runway_inspection": gettext_lazy("Inspect the runway"),
    "fod_sweep": gettext_lazy("Sweep for FOD"),
    "tow_aircraft": gettext_lazy("Tow the aircraft"),
}

# Plain words per action; %(...)s are the call's arguments (diagnosis.consequences).
PLAIN: dict[str, Promise] = {
    "close_runway": gettext_lazy("Close runway %(runway)s"),
    "close_taxiway": gettext_lazy("Close taxiway %(taxiway)s"),
    "suspend_stand_operations": gettext_lazy("Suspend operations at stand %(stand)s"),
    "dispatch_cleanup_crew": gettext_lazy("Send the cleanup crew to %(position)s"),
    "request_fire_standby": gettext_lazy("Fire and rescue on standby at %(position)s"),
    "fod_sweep": gettext_lazy("FOD sweep at %(position)s"),
    "runway_inspection": gettext_lazy("Inspect runway %(runway)s"),
    "tow_aircraft": gettext_lazy("Tow %(flight_no)s away from %(position)s"),
    "notify_atc": gettext_lazy("Notify ATC"),
}

# What a dispatch's result says. The log keeps it in English (language-neutral, as the
# rest of the log); pages and reports word it per reader (diagnosis.wording.done_words).
DISPATCHES: dict[str, Promise] = {
    "notify_atc": gettext_lazy("ATC notified"),
    "dispatch_cleanup_crew": gettext_lazy("Cleanup crew dispatched"),
    "request_fire_standby": gettext_lazy("Fire and rescue on standby"),
    "runway_inspection": gettext_lazy("Runway inspection ordered"),
    "fod_sweep": gettext_lazy("FOD sweep ordered"),
    "tow_aircraft": gettext_lazy("Tow requested"),
}

# An action's arguments in words: a dispatch's result names them ("position 105",
# "flight CA1234"), and the cards and forms label them.
ARGUMENT_WORDS: dict[str, Promise] = {
    "position": pgettext_lazy("action argument", "position"),
    "runway": pgettext_lazy("action argument", "runway"),
    "taxiway": pgettext_lazy("action argument", "taxiway"),
    "stand": pgettext_lazy("action argument", "stand"),
    "flight_no": pgettext_lazy("action argument", "flight"),
    "message": pgettext_lazy("action argument", "message"),
}

# What a call acts on, in the order the timeline names it ("Close taxiway (A)").
TARGET_ARGS = ("runway", "taxiway", "stand", "position", "flight_no")

# What each editable argument names on the airport (flight numbers are free text).
ARG_KINDS = {"runway": "runway", "taxiway": "taxiway", "stand": "stand", "position": "position"}


def _known_target(graph: AirportGraph, kind: str, target: str) -> bool:
    if kind == "taxiway":
        return target in {n.taxiway for n in graph.nodes.values() if n.taxiway}
    if kind == "runway":
        return target in graph.runways
    node = graph.nodes.get(target)
    return node is not None and node.kind == "stand"


def action_request(ctx: ToolContext, tool_call: ToolCall) -> tuple[str, str, dict[str, Any]]:
    """(system, operation, body) of the call's request. Raises ToolFailure for a request
    that no retry could make acceptable (an unknown tool or target)."""
    name = tool_call.tool_name
    args = tool_call.request_payload
    if name not in ACTIONS:
        raise ToolFailure(f"unknown action tool {name}")
    if name in RESTRICTING:
        kind, arg = RESTRICTING[name]
        if not _known_target(ctx.graph, kind, args[arg]):
            raise ToolFailure(f"{args[arg]} is not a {kind} of {ctx.graph.icao}")
    return ACTIONS[name][2], name, {"airport": ctx.graph.icao, **args}


def action_result(ctx: ToolContext, tool_call: ToolCall, remote: dict[str, Any]) -> dict[str, Any]:
    """The call's response from the external system's answer; a closure or suspension
    is put in force on our map too. Runs in the transaction that records the result."""
    name = tool_call.tool_name
    args = tool_call.request_payload
    reference = remote.get("reference", "")
    if name in RESTRICTING:
        kind, arg = RESTRICTING[name]
        target = args[arg]
        Restriction.objects.create(
            kind=kind, target=target, session_id=ctx.session_id, tool_call=tool_call
        )
        notify_board()  # after the commit that puts it in force
        with translation.override("en"):  # the log's language, whatever the settings'
            summary = restriction_summary(kind, target)
        return {
            "summary": summary,
            "restriction": {"kind": kind, "target": target},
            "reference": reference,
        }
    with translation.override("en"):
        response = {"summary": dispatch_summary(name, args), "reference": reference}
    if name == "notify_atc":
        response["message"] = args.get("message", "")
    return response


def checked_args(tool: str, before: dict[str, Any], edited: dict[str, str]) -> dict[str, Any]:
    """The call's arguments with the edited ones, each naming something on the airport.
    The free-text message of notify_atc stays as the agent wrote it."""
    graph = load_active_graph()
    names = [name for name in ACTION_ARGS.get(tool, ()) if name != "message"]
    after = dict(before)
    for name in names:
        value = (edited.get(name) or "").strip()
        if not value:
            raise ActionError(_("%(name)s is empty: give a value.") % {"name": name})
        value = checked_text(value, limit=32, what=name)
        kind = ARG_KINDS.get(name)
        if kind == "runway" and value.upper() not in graph.runways:
            raise ActionError(
                _("%(v)s is not a runway of %(icao)s.") % {"v": value, "icao": graph.icao}
            )
        if kind == "taxiway" and value.upper() not in {
            n.taxiway for n in graph.nodes.values() if n.taxiway
        }:
            raise ActionError(
                _("%(v)s is not a taxiway of %(icao)s.") % {"v": value, "icao": graph.icao}
            )
        if kind == "stand":
            node = graph.nodes.get(value)
            if node is None or node.kind != "stand":
                raise ActionError(
                    _("%(v)s is not a stand of %(icao)s.") % {"v": value, "icao": graph.icao}
                )
        if kind == "position" and graph.resolve(value) is None:
            raise ActionError(
                _("%(v)s is not a stand, taxiway node or runway of %(icao)s.")
                % {"v": value, "icao": graph.icao}
            )
        after[name] = value.upper() if kind in ("runway", "taxiway") else value
    return after


def action_tools() -> dict[str, ActionTool]:
    """The nine actions as the pack registers them."""
    return {
        name: ActionTool(
            name=name,
            risk_floor=floor,
            system=system,
            request=action_request,
            result=action_result,
            args=args,
            editable=tuple(a for a in args if a != "message"),
            check_args=partial(checked_args, name),
            restricts=RESTRICTING.get(name),
            plain=PLAIN[name],
            done=DISPATCHES.get(name),
            schema=SCHEMAS[name][0],
            description=SCHEMAS[name][1],
            value_words=value_words,
        )
        for name, (args, floor, system) in ACTIONS.items()
    }
