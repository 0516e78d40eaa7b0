"""The apron's words for what the core shows of it beyond its actions: its lookups'
labels, the lift of a restriction (a core action lifting what the apron's actions put in
force) and the kinds of the airport's places."""

from __future__ import annotations

from django.utils.functional import Promise
from django.utils.translation import gettext_lazy, pgettext_lazy

from aero.packs import HistoryFilter

TOOL_LABELS: dict[str, Promise] = {
    "lift_restriction": gettext_lazy("Lift a closure"),
    "lookup_aircraft_info": gettext_lazy("Look up the aircraft"),
    "lookup_flight_plan": gettext_lazy("Look up the flight plan"),
    "lookup_stand_location": gettext_lazy("Look up the position"),
}

# The lift's plain words; %(...)s are its arguments (diagnosis.consequences).
PLAIN: dict[str, Promise] = {
    "lift_restriction": gettext_lazy("Lift the closure of %(kind)s %(target)s"),
}

# The kinds of the airport graph's nodes (packs.airport.definition's node kinds).
NODE_KINDS: dict[str, Promise] = {
    "stand": pgettext_lazy("airport node kind", "stand"),
    "taxiway": pgettext_lazy("airport node kind", "taxiway"),
    "runway": pgettext_lazy("airport node kind", "runway"),
}


def _typed(value: str) -> str:
    return value.strip().upper()


# History finds apron sessions by the flight and the position the reporter named, typed
# in; each is a column of the history's rows (replay migration 0001 indexes both).
HISTORY_FILTERS = (
    HistoryFilter(
        "flight",
        ("fields", "flight_no"),
        gettext_lazy("Flight"),
        max_length=16,
        pattern=r"^[-A-Za-z0-9 ]*$",
        clean=_typed,
        column=True,
    ),
    HistoryFilter(
        "position",
        ("fields", "position"),
        gettext_lazy("Position"),
        max_length=32,
        pattern=r"^[-A-Za-z0-9/ ]*$",
        clean=_typed,
        column=True,
    ),
)
