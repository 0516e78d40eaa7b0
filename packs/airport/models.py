"""The airport world: one active topology (stands, taxiway and runway nodes, the edges
between them, runways by their reference node) and the flights at its stands; the
restrictions in force; the apron scenario draft's own settings and rows. The tables the
core held keep their names (db_table), so no data moves."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils.text import format_lazy
from django.utils.translation import gettext_lazy as _

from scenarios_admin.models import LIST_HELP, DraftRow, Level, RiskClass, Scenario


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


# --- the row editor's draft rows ------------------------------------------------------------
# A scenario draft's rules, spread radius, actions and example cases, as the scenario admin's
# row editor edits them (the core keeps the draft's fields and values, which every
# row-edited kind has). The tables keep the names they had in the core (db_table).


class ApronDraft(models.Model):
    """A draft's apron settings, one row per scenario: where the impact analysis starts,
    what its spread radius depends on, and the compliance state machine's six states."""

    scenario = models.OneToOneField(Scenario, on_delete=models.CASCADE, related_name="apron_draft")
    impact_start = models.CharField(
        "impact starts at",
        max_length=64,
        blank=True,
        help_text=_("The position field whose node starts the impact analysis."),
    )
    radius_key = models.CharField(
        "radius depends on",
        max_length=64,
        blank=True,
        help_text=_(
            "An enum field whose value selects the spread radius row; empty: by level only."
        ),
    )
    default_radius = models.PositiveSmallIntegerField(
        default=1, help_text=_("Hops when no spread radius row matches.")
    )
    compliance_states = models.JSONField(default=list, blank=True)

    class Meta:
        verbose_name = "apron settings"
        verbose_name_plural = "apron settings"

    def __str__(self) -> str:
        return f"impact from {self.impact_start or '?'}"


class RiskRule(DraftRow):
    scenario = models.ForeignKey(Scenario, on_delete=models.CASCADE, related_name="draft_rules")
    rule_id = models.CharField("id", max_length=32)
    condition = models.TextField(
        blank=True,
        help_text=_(
            "e.g. fluid_type=FUEL, continuous=true · phase=TAKEOFF_ROLL|CLIMB · "
            "phase!=STAND · a=1 OR b=2. Empty: always."
        ),
    )
    level = models.CharField(max_length=8, choices=Level.choices)
    score = models.PositiveSmallIntegerField(help_text=_("0-100"))

    class Meta:
        db_table = "scenarios_admin_riskrule"
        ordering = ["scenario", "position", "id"]
        verbose_name = "risk rule"
        constraints = [
            models.UniqueConstraint(fields=["scenario", "rule_id"], name="scenario_rule_id_unique"),
        ]

    def __str__(self) -> str:
        return self.rule_id


class SpreadRadius(models.Model):
    scenario = models.ForeignKey(Scenario, on_delete=models.CASCADE, related_name="draft_radii")
    key_value = models.CharField(
        "value", max_length=64, blank=True, help_text=_("Value of the 'radius depends on' field.")
    )
    level = models.CharField(max_length=8, choices=Level.choices)
    hops = models.PositiveSmallIntegerField()

    class Meta:
        db_table = "scenarios_admin_spreadradius"
        ordering = ["scenario", "key_value", "id"]
        verbose_name = "spread radius"
        verbose_name_plural = "spread radius table"
        constraints = [
            models.UniqueConstraint(
                fields=["scenario", "key_value", "level"], name="scenario_radius_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.key_value} {self.level}: {self.hops}"


class ScenarioAction(DraftRow):
    scenario = models.ForeignKey(Scenario, on_delete=models.CASCADE, related_name="draft_actions")
    tool = models.CharField(max_length=64)
    risk_class = models.CharField(max_length=2, choices=RiskClass.choices)
    condition = models.TextField(
        blank=True, help_text=_("As for risk rules, plus level=HIGH and impact.runways=non_empty.")
    )
    for_each = models.CharField(
        max_length=32, blank=True, help_text=_("One action per item of an impact list.")
    )
    args = models.TextField(
        blank=True,
        help_text=_(
            "One name=value per line; {fields.position}, {risk.level}, {item} are filled in."
        ),
    )

    class Meta:
        db_table = "scenarios_admin_scenarioaction"
        ordering = ["scenario", "position", "id"]
        verbose_name = "required action"

    def __str__(self) -> str:
        return self.tool


class ScenarioExample(DraftRow):
    scenario = models.ForeignKey(Scenario, on_delete=models.CASCADE, related_name="draft_examples")
    text = models.TextField(help_text=_("What an operator would write."))
    expected_fields = models.TextField(
        help_text=_("e.g. flight_no=CA1234, position=105, continuous=true")
    )
    rule = models.CharField(max_length=32)
    level = models.CharField(max_length=8, choices=Level.choices)
    actions = models.TextField(
        help_text=format_lazy("{} {}", _("Action tools expected, in order."), LIST_HELP)
    )

    class Meta:
        db_table = "scenarios_admin_scenarioexample"
        ordering = ["scenario", "position", "id"]
        verbose_name = "example case"

    def __str__(self) -> str:
        return self.text[:60]
