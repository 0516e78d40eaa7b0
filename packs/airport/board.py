"""The airport board: the airport graph with the restrictions in force, and what an
action would do to it.

"Close taxiway A — 2 flights lose their way to a runway"; "Close runway 06/24 — no
runway is open afterwards; 5 flights held"; or "already in force (closed by session X)".
"""

from __future__ import annotations

from collections import deque
from typing import Any

from django.utils.translation import gettext, ngettext

from diagnosis.consequences import Consequence, plain_words
from packs.airport.graph import AirportGraph
from packs.airport.models import Restriction
from scenarios_admin.definition import restriction_of


class Board:
    """The airport with the restrictions in force: what is closed, what can still reach
    an open runway."""

    def __init__(self, graph: AirportGraph, active: list[Restriction]) -> None:
        self.graph = graph
        self.active = active
        self.closed = {(r.kind, r.target) for r in active}

    def _blocked(self, closed: set[tuple[str, str]]) -> set[str]:
        return {
            node.node_id
            for node in self.graph.nodes.values()
            if ("taxiway", node.taxiway) in closed
            or ("runway", node.runway) in closed
            or ("stand", node.node_id) in closed
        }

    def open_runways(self, closed: set[tuple[str, str]]) -> list[str]:
        return sorted(r for r in self.graph.runways if ("runway", r) not in closed)

    def stands_cut_off(self, closed: set[tuple[str, str]]) -> set[str]:
        """Stands from which no path over open nodes reaches an open runway."""
        blocked = self._blocked(closed)
        open_runways = set(self.open_runways(closed))
        goals = {
            n.node_id
            for n in self.graph.nodes.values()
            if n.kind == "runway" and n.runway in open_runways and n.node_id not in blocked
        }
        reached = set(goals)
        queue = deque(goals)
        while queue:
            current = queue.popleft()
            for neighbour in self.graph.adjacency.get(current, ()):
                if neighbour not in reached and neighbour not in blocked:
                    reached.add(neighbour)
                    queue.append(neighbour)
        stands = {n.node_id for n in self.graph.nodes.values() if n.kind == "stand"}
        return stands - reached

    def in_force(self, kind: str, target: str) -> Restriction | None:
        return next((r for r in self.active if (r.kind, r.target) == (kind, target)), None)

    def consequence(self, tool: str, args: dict[str, Any], session_id: Any = None) -> Consequence:
        """`session_id`: the session the action belongs to (a closure it put in force
        itself is its own, not "closed by another session")."""
        plain = plain_words(tool, args)
        effect = restriction_of(tool, args)
        if effect is None:
            return Consequence(plain, "", False, None)
        existing = self.in_force(*effect)
        if existing is not None:
            own = session_id is not None and str(existing.session_id) == str(session_id)
            return Consequence(plain, gettext("already in force"), False, existing, own)
        after = self.closed | {effect}
        runways_left = self.open_runways(after)
        newly_cut = self.stands_cut_off(after) - self.stands_cut_off(self.closed)
        if effect[0] == "stand":
            newly_cut |= {effect[1]}
        flights = self.graph.flights_at(sorted(newly_cut))
        parts = []
        warn = False
        if effect[0] == "runway" or not runways_left:
            if runways_left:
                parts.append(
                    gettext("runways still open: %(runways)s")
                    % {"runways": ", ".join(runways_left)}
                )
            else:
                parts.append(gettext("afterwards no runway is open"))
                flights = sorted(f.flight_no for f in self.graph.flights.values())
                warn = True
        if flights:
            warn = True
            parts.append(
                ngettext(
                    "affects %(n)d flight (%(list)s)",
                    "affects %(n)d flights (%(list)s)",
                    len(flights),
                )
                % {"n": len(flights), "list": ", ".join(flights)}
            )
        elif effect[0] != "runway":
            parts.append(gettext("no flight loses its way to a runway"))
        return Consequence(plain, "; ".join(parts), warn, None)
