"""How the apron agent reads the reporter's words, as the core's providers call it
(aero.packs.Reading): the synonyms' reading, the grounding of a model's claims, and an
operator's typed correction of a flight number or a position."""

from __future__ import annotations

from typing import Any

from aero.packs import Reading
from diagnosis.decisions import ActionError
from packs.airport.agent.extraction import FLIGHT_NO, extract_fields
from packs.airport.agent.grounding import ground
from packs.airport.agent.prompts import EXTRACT
from packs.airport.graph import AirportGraph


def corrected(spec: dict[str, Any], raw: str, graph: AirportGraph) -> Any:
    """A corrected position or flight number as the agent stores it."""
    if spec["type"] == "position":
        node = graph.resolve(raw)
        if node is None:
            raise ActionError(f"{raw} is not a stand, taxiway node or runway of {graph.icao}.")
        return raw.upper() if node.kind != "stand" else node.node_id
    if spec["type"] == "flight_no":
        if not FLIGHT_NO.fullmatch(raw.upper()):
            raise ActionError(f"{raw} is not a flight number (for example CA1234).")
        return raw.upper()
    return raw


READING = Reading(offline=extract_fields, ground=ground, instructions=EXTRACT, corrected=corrected)
