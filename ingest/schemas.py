"""Alert payloads: Prometheus Alertmanager's webhook (version 4) and a generic form.

A delivery is validated in two steps: its envelope (the group), which a client must get
right, then each alert on its own, so one bad alert never costs the others their
delivery (Alertmanager gives up on a group answered with a 4xx)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

# A label or annotation value goes into the session's events (an alert's summary): bound
# like what people type (aero.text.MAX_MESSAGE), so no alert can make an event over the
# per-event cap fail its delivery with a 500 that Alertmanager would retry forever. A
# longer value is cut, and says so, rather than refused.
MAX_LABEL_VALUE = 4000
MAX_ALERTS = 1000


def cut(value: str, limit: int = MAX_LABEL_VALUE) -> str:
    """`value`, at most `limit` characters: a longer one ends with a marker naming its
    original length."""
    if len(value) <= limit:
        return value
    mark = f" …[cut: {len(value):,} characters]"
    return value[: limit - len(mark)] + mark


def _cut_value(value: Any) -> Any:
    return cut(value) if isinstance(value, str) else value


Value = Annotated[str, BeforeValidator(_cut_value)]
Labels = dict[Annotated[str, Field(max_length=200)], Value]


class AlertmanagerAlert(BaseModel):
    model_config = ConfigDict(extra="ignore")

    status: Literal["firing", "resolved"]
    labels: Labels = Field(default_factory=dict)
    annotations: Labels = Field(default_factory=dict)
    startsAt: datetime | None = None  # noqa: N815 (Alertmanager's field names)
    endsAt: datetime | None = None  # noqa: N815
    generatorURL: str = ""  # noqa: N815
    fingerprint: str = Field("", max_length=64)


class AlertmanagerPayload(BaseModel):
    """https://prometheus.io/docs/alerting/latest/configuration/#webhook_config"""

    model_config = ConfigDict(extra="ignore")

    version: Literal["4"]
    groupKey: str = Field(..., max_length=1000)  # noqa: N815
    truncatedAlerts: int = 0  # noqa: N815
    status: Literal["firing", "resolved"]
    receiver: str = ""
    groupLabels: Labels = Field(default_factory=dict)  # noqa: N815
    commonLabels: Labels = Field(default_factory=dict)  # noqa: N815
    commonAnnotations: Labels = Field(default_factory=dict)  # noqa: N815
    externalURL: str = ""  # noqa: N815
    alerts: list[Any] = Field(..., max_length=MAX_ALERTS)  # each an AlertmanagerAlert


class GenericAlert(BaseModel):
    """For any other alert source: one alert, or a list of them under "alerts"."""

    model_config = ConfigDict(extra="forbid")

    source: str = Field("generic", min_length=1, max_length=60)
    status: Literal["firing", "resolved"] = "firing"
    labels: Labels = Field(..., min_length=1)
    annotations: Labels = Field(default_factory=dict)
    fingerprint: str = Field("", max_length=64)
    group_key: str = Field("", max_length=255)
    actor: str = Field("", max_length=150)
    starts_at: datetime | None = None


class GenericPayload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    alerts: list[Any] = Field(..., min_length=1, max_length=MAX_ALERTS)  # each a GenericAlert
