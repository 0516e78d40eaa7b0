"""The pydantic argument models of the airport's tools: the model's tool list is
generated from them and a call the model picks is validated against them
(diagnosis.agent.react)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FlightArgs(_Args):
    flight_no: str = Field(description="flight number, e.g. CA1234")


class PositionArgs(_Args):
    position: str = Field(description="stand, taxiway node or runway designator")


class MessageArgs(_Args):
    message: str


class StandArgs(_Args):
    stand: str


class TaxiwayArgs(_Args):
    taxiway: str = Field(description="taxiway letter, e.g. A")


class RunwayArgs(_Args):
    runway: str = Field(description="runway designator, e.g. 06/24")


class TowArgs(_Args):
    flight_no: str
    position: str


# tool -> (argument model, the description the model reads)
SCHEMAS: dict[str, tuple[type[BaseModel], str]] = {
    "lookup_aircraft_info": (FlightArgs, "Aircraft type, airline and registration of a flight."),
    "lookup_flight_plan": (FlightArgs, "Schedule, destination and passengers of a flight."),
    "lookup_stand_location": (PositionArgs, "Where a stand or node is and what is next to it."),
    "notify_atc": (MessageArgs, "Notify air traffic control (R0, automatic)."),
    "dispatch_cleanup_crew": (PositionArgs, "Send the cleanup crew (R1)."),
    "request_fire_standby": (PositionArgs, "Ask the fire service to stand by (R1)."),
    "suspend_stand_operations": (StandArgs, "Suspend operations at a stand (R2)."),
    "close_taxiway": (TaxiwayArgs, "Close a taxiway (R2)."),
    "close_runway": (RunwayArgs, "Close a runway (R3)."),
    "runway_inspection": (RunwayArgs, "Inspect a runway (R1)."),
    "fod_sweep": (PositionArgs, "Sweep foreign object debris (R1)."),
    "tow_aircraft": (TowArgs, "Tow an aircraft away (R1)."),
}


class NoArgs(_Args):
    """The deterministic tools read the session's fields; the model passes nothing."""


# The apron agent's own analyses (ToolRegistry.analyses).
ANALYSES: dict[str, tuple[type[BaseModel], str]] = {
    "assess_risk": (NoArgs, "Risk level by the scenario's rule table (deterministic)."),
    "analyze_impact": (NoArgs, "Impact zone by breadth-first search on the airport graph."),
}
