"""The session panel's pictures, as geometry for a server-rendered inline SVG (no script,
no chart library): each anomalous metric over the window with its onset and the blamed
change marked, and the system's service graph with the root cause and the services
around it highlighted. Both draw in a fixed viewBox that the page scales to its width."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.utils.translation import gettext as _

from packs.diagnosis.system import System
from packs.diagnosis.words import METRIC_LABELS, label

# The chart's viewBox: 400 wide, so it is drawn 1:1 on a 400 px phone.
WIDTH, HEIGHT = 400, 120
LEFT, RIGHT, TOP, BOTTOM = 40, 8, 10, 22
MAX_POINTS = 120  # what a recorded series keeps (bucket maxima: a spike is never lost)


def downsample(samples: list[tuple[datetime, float]]) -> list[list[Any]]:
    """At most MAX_POINTS [iso time, value] pairs: each bucket's largest value, at its
    time, so a short spike stays in the picture."""
    if len(samples) <= MAX_POINTS:
        return [[ts.isoformat(), value] for ts, value in samples]
    size = -(-len(samples) // MAX_POINTS)
    out = []
    for start in range(0, len(samples), size):
        ts, value = max(samples[start : start + size], key=lambda s: s[1])
        out.append([ts.isoformat(), value])
    return out


def _number(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"


@dataclass
class Marker:
    x: float
    label: str
    at: str  # HH:MM

    @property
    def anchor(self) -> str:
        """Its label on the side with room: right of the line in the left half."""
        return "start" if self.x < WIDTH / 2 else "end"

    @property
    def dx(self) -> int:
        return 3 if self.x < WIDTH / 2 else -3


@dataclass
class MetricChart:
    key: str  # unique on the page (ids of title and desc)
    service: str
    metric: str
    points: str  # the polyline's "x,y x,y ..."
    y_max: str
    y_min: str
    start: str
    end: str
    baseline_y: float | None
    onset: Marker | None
    change: Marker | None
    description: str
    width: int = WIDTH
    height: int = HEIGHT
    plot: dict[str, float] = field(default_factory=dict)


def metric_chart(
    index: int,
    anomaly: dict[str, Any],
    change: dict[str, Any] | None,
) -> MetricChart | None:
    """One anomaly's chart, or None when its result holds no series (an older session's
    evidence). `change`: the blamed deploy or config change ({label, at}), if any."""
    series = [(datetime.fromisoformat(ts), float(v)) for ts, v in anomaly.get("series") or []]
    if len(series) < 2:
        return None
    t0, t1 = series[0][0], series[-1][0]
    span = (t1 - t0).total_seconds() or 1.0
    values = [v for _, v in series]
    low, high = min(0.0, min(values)), max(values)
    high = high if high > low else low + 1.0
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x_of(moment: datetime) -> float:
        share = (moment - t0).total_seconds() / span
        return round(LEFT + max(0.0, min(1.0, share)) * plot_w, 1)

    def y_of(value: float) -> float:
        return round(TOP + (1 - (value - low) / (high - low)) * plot_h, 1)

    def marker(moment: datetime | None, label: str) -> Marker | None:
        if moment is None or not t0 <= moment <= t1:
            return None
        return Marker(x_of(moment), label, moment.strftime("%H:%M"))

    onset_at = datetime.fromisoformat(anomaly["onset"]) if anomaly.get("onset") else None
    change_at = datetime.fromisoformat(change["at"]) if change and change.get("at") else None
    onset = marker(onset_at, _("onset"))
    blamed = marker(change_at, change["label"]) if change else None
    words = {
        "metric": label(METRIC_LABELS, anomaly["metric"]),
        "service": anomaly["service"],
        "baseline": _number(float(anomaly.get("baseline") or 0)),
        "peak": _number(float(anomaly.get("peak") or 0)),
        "onset": onset_at.strftime("%H:%M") if onset_at else "-",
        "start": t0.strftime("%H:%M"),
        "end": t1.strftime("%H:%M"),
    }
    description = (
        _(
            "%(metric)s of %(service)s from %(start)s to %(end)s: baseline %(baseline)s, "
            "peak %(peak)s, anomalous from %(onset)s."
        )
        % words
    )
    if blamed is not None:
        description += " " + _("%(change)s at %(at)s.") % {"change": blamed.label, "at": blamed.at}
    baseline = anomaly.get("baseline")
    return MetricChart(
        key=f"chart-{index}",
        service=anomaly["service"],
        metric=anomaly["metric"],
        points=" ".join(f"{x_of(ts)},{y_of(v)}" for ts, v in series),
        y_max=_number(high),
        y_min=_number(low),
        start=words["start"],
        end=words["end"],
        baseline_y=y_of(float(baseline)) if baseline is not None else None,
        onset=onset,
        change=blamed,
        description=description,
        plot={
            "left": LEFT,
            "right": WIDTH - RIGHT,
            "top": TOP,
            "bottom": HEIGHT - BOTTOM,
            "tick_x": LEFT - 4,  # the value labels, right-aligned left of the axis
            "top_text": TOP + 8,
            "bottom_text": HEIGHT - BOTTOM - 4,
            "time_y": HEIGHT - 6,
        },
    )


# --- the service graph -----------------------------------------------------------------------

NODE_W, NODE_H, ROW = 72, 22, 52


@dataclass
class Node:
    name: str
    kind: str
    x: float  # centre
    y: float  # top
    role: str  # "root" | "related" | ""
    left: float = 0.0
    text_y: float = 0.0


@dataclass
class Edge:
    x1: float
    y1: float
    x2: float
    y2: float
    hot: bool  # between the root cause and a service around it


@dataclass
class ServiceGraph:
    nodes: list[Node]
    edges: list[Edge]
    width: int
    height: int
    node_w: int
    node_h: int
    description: str


def _layers(system: System) -> dict[str, int]:
    """Each service's row: the longest call path from a service nobody calls, so every
    edge points down."""
    depth: dict[str, int] = {}

    def visit(name: str, seen: frozenset[str]) -> int:
        if name in depth:
            return depth[name]
        callers = [c for c in system.callers(name) if c not in seen]
        depth[name] = 1 + max((visit(c, seen | {name}) for c in callers), default=-1)
        return depth[name]

    for name in system.services:
        visit(name, frozenset())
    return depth


def service_graph(system: System, root: str | None, related: list[str]) -> ServiceGraph:
    layers = _layers(system)
    rows: dict[int, list[str]] = {}
    for name in system.services:  # the system file's order within a row
        rows.setdefault(layers[name], []).append(name)
    widest = max(len(names) for names in rows.values())
    node_w = min(NODE_W, int(WIDTH / widest) - 6)
    nodes: dict[str, Node] = {}
    for row, names in sorted(rows.items()):
        step = WIDTH / len(names)
        for i, name in enumerate(names):
            role = "root" if name == root else "related" if name in related else ""
            x, y = round(step * (i + 0.5), 1), 6 + row * ROW
            nodes[name] = Node(
                name, system.kind(name), x, y, role, left=x - node_w / 2, text_y=y + 15
            )
    edges = []
    for name, spec in system.services.items():
        for dependency in spec.depends_on:
            if dependency not in nodes:
                continue
            a, b = nodes[name], nodes[dependency]
            hot = (name == root and dependency in related) or (
                dependency == root and name in related
            )
            edges.append(Edge(a.x, a.y + NODE_H, b.x, b.y, hot))
    around = ", ".join(s for s in related if s != root) or "-"
    description = (
        _("Root cause: %(root)s. Services around it: %(related)s.")
        % {"root": root or "-", "related": around}
        if root
        else _("No root cause yet.")
    )
    return ServiceGraph(
        nodes=list(nodes.values()),
        edges=edges,
        width=WIDTH,
        height=12 + (max(rows) + 1) * ROW - (ROW - NODE_H),
        node_w=node_w,
        node_h=NODE_H,
        description=description,
    )
