"""The airport topology admin: the graph (nodes, edges, runways, flights) edited and
validated as a whole, and the flights on their own."""

from __future__ import annotations

import re
from typing import Any

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from aero.admin_base import ReadOnlyAdmin
from packs.airport.models import Flight, Restriction, Runway, Topology, TopologyEdge, TopologyNode
from packs.airport.topology import TopologyData, data_of, topology_issues, topology_map
from scenarios_admin.admin_check import CheckedInlineFormSet, CrossCheck, place_problem

# --- forms ----------------------------------------------------------------------------------


class NodeRefForm(forms.ModelForm[Any]):
    """A row that names nodes by id (text), so nodes added in the same save can be used.
    The ids are turned into references when the row is saved, after the nodes."""

    node_refs: dict[str, str] = {}  # form field -> model foreign key

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name, fk in self.node_refs.items():
            node = getattr(self.instance, fk, None) if self.instance.pk else None
            if node is not None:
                self.initial[name] = node.node_id

    def save(self, commit: bool = True) -> Any:
        for name, fk in self.node_refs.items():
            node_id = self.cleaned_data.get(name) or ""
            node = (
                TopologyNode.objects.get(topology=self.instance.topology, node_id=node_id)
                if node_id
                else None
            )
            setattr(self.instance, fk, node)
        return super().save(commit)


class EdgeForm(NodeRefForm):
    node_refs = {"source_id": "source", "target_id": "target"}
    source_id = forms.CharField(label=gettext_lazy("from node"), max_length=32)
    target_id = forms.CharField(label=gettext_lazy("to node"), max_length=32)

    class Meta:
        fields: list[str] = []


class RunwayForm(NodeRefForm):
    node_refs = {"reference_id": "reference_node"}
    reference_id = forms.CharField(
        label=gettext_lazy("reference node"),
        max_length=32,
        help_text=gettext_lazy("Where a runway-wide impact analysis starts (one of its nodes)."),
    )

    class Meta:
        fields = ["designator"]


class FlightForm(NodeRefForm):
    node_refs = {"stand_id": "stand"}
    stand_id = forms.CharField(label=gettext_lazy("stand"), max_length=32, required=False)

    class Meta:
        fields = ["flight_no", "airline", "aircraft", "registration", "std", "destination", "pax"]


class TopologyForm(forms.ModelForm[Any]):
    cross_check: CrossCheck | None = None

    class Meta:
        fields = ["icao", "name", "is_active"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.cross_check is not None:
            self.cross_check.form = self

    def clean_is_active(self) -> bool:
        active = bool(self.cleaned_data.get("is_active"))
        other = Topology.objects.filter(is_active=True).exclude(pk=self.instance.pk).first()
        if active and other is not None:
            raise ValidationError(
                _(
                    "Only one topology is active (the agent's impact analysis uses it): "
                    "deactivate %(icao)s first."
                )
                % {"icao": other.icao}
            )
        return active


def validate_topology(check: CrossCheck) -> list[str]:
    """The graph the page describes (nodes, edges, runways, flights) checked as a whole."""

    def rows(model: type[Any]) -> list[forms.ModelForm[Any]]:
        formset = check.formset(model)
        return formset.live_forms() if formset is not None else []

    nodes, edges, runways, flights = (
        rows(TopologyNode),
        rows(TopologyEdge),
        rows(Runway),
        rows(Flight),
    )
    # A renamed node keeps its edges, runway and flights: rows that still name it by its
    # old id follow it.
    new_ids = {f.cleaned_data["node_id"] for f in nodes}
    renamed = {
        f.initial["node_id"]: f.cleaned_data["node_id"]
        for f in nodes
        if f.instance.pk and f.initial.get("node_id") not in (None, f.cleaned_data["node_id"])
    }
    for row in (*edges, *runways, *flights):
        for name in row.node_refs:  # type: ignore[attr-defined]
            node_id = row.cleaned_data.get(name) or ""
            if node_id not in new_ids and node_id in renamed:
                row.cleaned_data[name] = renamed[node_id]
    data = TopologyData(
        nodes=[
            {
                "node_id": f.cleaned_data["node_id"],
                "kind": f.cleaned_data["kind"],
                "runway": f.cleaned_data.get("runway") or "",
            }
            for f in nodes
        ],
        edges=[(f.cleaned_data["source_id"], f.cleaned_data["target_id"]) for f in edges],
        runways=[(f.cleaned_data["designator"], f.cleaned_data["reference_id"]) for f in runways],
        flights=[
            (f.cleaned_data["flight_no"], f.cleaned_data.get("stand_id") or "") for f in flights
        ],
    )
    parts: dict[str, tuple[str, list[forms.ModelForm[Any]]]] = {
        "nodes": ("Node", nodes),
        "edges": ("Edge", edges),
        "runways": ("Runway", runways),
        "flights": ("Flight", flights),
    }
    form = check.form
    assert form is not None
    summary = []
    for issue in topology_issues(data):
        match = _INDEXED_TOPOLOGY.match(issue.path)
        if match and match.group(1) in parts:
            label, part_rows = parts[match.group(1)]
            index = int(match.group(2))
            summary.append(
                place_problem(part_rows[index], None, issue.message, f"{label} row {index + 1}")
            )
        else:
            summary.append(place_problem(form, None, issue.message, "Topology"))
    return summary


_INDEXED_TOPOLOGY = re.compile(r"^(nodes|edges|runways|flights)\[(\d+)\]$")


# --- admin ----------------------------------------------------------------------------------


class TopologyNodeInline(admin.TabularInline[TopologyNode, Topology]):
    model = TopologyNode
    formset = CheckedInlineFormSet
    fields = ["node_id", "kind", "runway", "x", "y"]
    extra = 0
    verbose_name_plural = gettext_lazy(
        "Nodes (stands, taxiway nodes, runway nodes; x/y place them on the map)"
    )


class TopologyEdgeInline(admin.TabularInline[TopologyEdge, Topology]):
    model = TopologyEdge
    form = EdgeForm
    formset = CheckedInlineFormSet
    fields = ["source_id", "target_id"]
    extra = 0
    verbose_name_plural = gettext_lazy("Edges (undirected; name the two nodes)")

    def get_queryset(self, request: HttpRequest) -> QuerySet[TopologyEdge]:
        return super().get_queryset(request).select_related("source", "target").order_by("id")


class RunwayInline(admin.TabularInline[Runway, Topology]):
    model = Runway
    form = RunwayForm
    formset = CheckedInlineFormSet
    fields = ["designator", "reference_id"]
    extra = 0
    verbose_name_plural = gettext_lazy("Runways and their reference nodes")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Runway]:
        return super().get_queryset(request).select_related("reference_node")


class FlightInline(admin.TabularInline[Flight, Topology]):
    model = Flight
    form = FlightForm
    formset = CheckedInlineFormSet
    fields = [
        "flight_no",
        "airline",
        "aircraft",
        "registration",
        "stand_id",
        "std",
        "destination",
        "pax",
    ]
    extra = 0
    verbose_name_plural = gettext_lazy("Flights (the flight information the agent looks up)")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Flight]:
        return super().get_queryset(request).select_related("stand")


@admin.register(Topology)
class TopologyAdmin(admin.ModelAdmin[Topology]):
    """The airport graph, edited and validated as a whole (no dangling edges, duplicate
    ids or unreachable nodes), and drawn as the map the session pages show."""

    form = TopologyForm
    list_display = ["icao", "name", "is_active", "updated_at"]
    inlines = [TopologyNodeInline, TopologyEdgeInline, RunwayInline, FlightInline]

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        form = super().get_form(request, obj, change, **kwargs)
        check = CrossCheck.of(request, validate_topology)
        return type(form.__name__, (form,), {"cross_check": check})

    def get_formset_kwargs(
        self, request: HttpRequest, obj: Any, inline: Any, prefix: str
    ) -> dict[str, Any]:
        kwargs = super().get_formset_kwargs(request, obj, inline, prefix)
        kwargs["cross_check"] = CrossCheck.of(request, validate_topology)
        return kwargs

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        """Nodes first (edges, runways and flights name them), node deletions last, after
        the rows that named them were saved or deleted."""
        form.save_m2m()
        nodes, *others = formsets
        nodes.save(commit=False)
        for node in [*nodes.new_objects, *(obj for obj, _fields in nodes.changed_objects)]:
            node.save()
        for formset in others:
            self.save_formset(request, form, formset, change)
        for node in nodes.deleted_objects:
            node.delete()

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Any = None,
    ) -> HttpResponse:
        check: CrossCheck | None = getattr(request, "_aero_cross_check", None)
        context["graph_issues"] = check.summary if check is not None else []
        if obj is not None and obj.pk:
            context["map"] = topology_map(obj)
            context["saved_issues"] = [str(i) for i in topology_issues(data_of(obj))]
        return super().render_change_form(request, context, add, change, form_url, obj)


class FlightAdminForm(forms.ModelForm[Flight]):
    class Meta:
        model = Flight
        fields = [
            "topology",
            "flight_no",
            "airline",
            "aircraft",
            "registration",
            "stand",
            "std",
            "destination",
            "pax",
        ]

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        stand, topology = cleaned.get("stand"), cleaned.get("topology")
        if stand is None or topology is None:
            return cleaned
        if stand.kind != "stand" or stand.topology_id != topology.pk:
            self.add_error("stand", f"{stand.node_id} is not a stand of {topology}.")
        return cleaned


@admin.register(Flight)
class FlightAdmin(admin.ModelAdmin[Flight]):
    form = FlightAdminForm
    list_display = ["flight_no", "airline", "aircraft", "stand", "std", "destination", "pax"]
    list_filter = ["topology", "airline"]
    search_fields = ["flight_no", "registration"]


@admin.register(Restriction)
class RestrictionAdmin(ReadOnlyAdmin):
    """Put in force and lifted by the agent's actions and the lift's approvals only."""

    list_display = ["kind", "target", "session", "created_at", "lifted_at", "lifted_by"]
    list_filter = ["kind"]
