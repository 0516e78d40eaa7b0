"""The airport world: one active topology (stands, taxiway and runway nodes, the edges
between them, runways by their reference node) and the flights at its stands. The tables
keep the names they had when the core held them (db_table), so no data moves."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _


class NodeKind(models.TextChoices):
    STAND = "stand", "Stand"
    TAXIWAY = "taxiway", "Taxiway"
    RUNWAY = "runway", "Runway"


class Topology(models.Model):
    """An airport graph. Exactly one is active: the agent's impact analysis uses it."""

    icao = models.CharField(max_length=8, unique=True)
    name = models.CharField(max_length=120)
    is_active = models.BooleanField(default=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "scenarios_admin_topology"
        verbose_name_plural = "topologies"
        constraints = [
            models.UniqueConstraint(
                fields=["is_active"], condition=Q(is_active=True), name="topology_single_active"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.icao} {self.name}"


class TopologyNode(models.Model):
    topology = models.ForeignKey(Topology, on_delete=models.CASCADE, related_name="nodes")
    node_id = models.CharField(max_length=32)
    kind = models.CharField(max_length=16, choices=NodeKind.choices)
    runway = models.CharField(
        max_length=16, blank=True, help_text=_("Runway designator (runway nodes).")
    )
    x = models.PositiveIntegerField(default=0, help_text=_("Map position (SVG units)."))
    y = models.PositiveIntegerField(default=0)

    class Meta:
        db_table = "scenarios_admin_topologynode"
        ordering = ["topology", "node_id"]
        constraints = [
            models.UniqueConstraint(fields=["topology", "node_id"], name="topology_node_id_unique"),
            models.CheckConstraint(
                condition=Q(kind="runway", runway__gt="") | (~Q(kind="runway") & Q(runway="")),
                name="topology_node_runway_only_on_runway_nodes",
            ),
        ]

    def __str__(self) -> str:
        return self.node_id

    @property
    def taxiway(self) -> str:
        # A taxiway node's taxiway is its letter prefix (A3 -> "A").
        return self.node_id.rstrip("0123456789") if self.kind == NodeKind.TAXIWAY else ""


class TopologyEdge(models.Model):
    topology = models.ForeignKey(Topology, on_delete=models.CASCADE, related_name="edges")
    source = models.ForeignKey(TopologyNode, on_delete=models.CASCADE, related_name="+")
    target = models.ForeignKey(TopologyNode, on_delete=models.CASCADE, related_name="+")

    class Meta:
        db_table = "scenarios_admin_topologyedge"
        constraints = [
            models.UniqueConstraint(
                fields=["topology", "source", "target"], name="topology_edge_unique"
            ),
            models.CheckConstraint(
                condition=~Q(source=models.F("target")), name="topology_edge_no_self_loop"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.source_id} - {self.target_id}"


class Runway(models.Model):
    topology = models.ForeignKey(Topology, on_delete=models.CASCADE, related_name="runways")
    designator = models.CharField(max_length=16)
    reference_node = models.ForeignKey(TopologyNode, on_delete=models.PROTECT, related_name="+")

    class Meta:
        db_table = "scenarios_admin_runway"
        constraints = [
            models.UniqueConstraint(
                fields=["topology", "designator"], name="runway_designator_unique"
            ),
        ]

    def __str__(self) -> str:
        return self.designator


class Flight(models.Model):
    topology = models.ForeignKey(Topology, on_delete=models.CASCADE, related_name="flights")
    flight_no = models.CharField(max_length=8)
    airline = models.CharField(max_length=80)
    aircraft = models.CharField(max_length=40)
    registration = models.CharField(max_length=16)
    stand = models.ForeignKey(
        TopologyNode, null=True, blank=True, on_delete=models.SET_NULL, related_name="flights"
    )
    std = models.TimeField(help_text=_("Scheduled time of departure (local)."))
    destination = models.CharField(max_length=4)
    pax = models.PositiveIntegerField()

    class Meta:
        db_table = "scenarios_admin_flight"
        ordering = ["std", "flight_no"]
        constraints = [
            models.UniqueConstraint(fields=["topology", "flight_no"], name="flight_no_unique"),
        ]

    def __str__(self) -> str:
        return self.flight_no


class Restriction(models.Model):
    """An operational closure or suspension an executed action put on the airport. The table
    keeps the name it had when the core held it (db_table), so no row moves."""

    class Kind(models.TextChoices):
        RUNWAY = "runway", _("Runway closed")
        TAXIWAY = "taxiway", _("Taxiway closed")
        STAND = "stand", _("Stand operations suspended")

    kind = models.CharField(max_length=16, choices=Kind.choices)
    target = models.CharField(max_length=32)
    session = models.ForeignKey(
        "diagnosis.Session", on_delete=models.PROTECT, related_name="restrictions"
    )
    tool_call = models.OneToOneField(
        "diagnosis.ToolCall", on_delete=models.PROTECT, related_name="restriction"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    lifted_at = models.DateTimeField(null=True, blank=True)
    lifted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    lift_note = models.CharField(max_length=300, blank=True)

    class Meta:
        db_table = "diagnosis_restriction"
        ordering = ["kind", "target", "-created_at"]
        indexes = [
            # status board: active restrictions
            models.Index(
                fields=["kind", "target"],
                condition=Q(lifted_at__isnull=True),
                name="restriction_active_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()}: {self.target}"

    @property
    def is_active(self) -> bool:
        return self.lifted_at is None
