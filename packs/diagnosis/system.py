"""The system a diagnosis is about: its services, what each calls, and their kinds."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

DATA = Path(__file__).resolve().parent / "data"
ServiceKind = Literal["service", "database", "cache", "external"]


class Service(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: ServiceKind
    owner: str = ""
    repo_dir: str = ""
    depends_on: list[str] = []
    tls: bool = False


class KnowledgeItem(BaseModel):
    # Tags such as 500 or 429 are words here, whatever YAML reads them as.
    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True)

    id: str
    title: str
    services: list[str] = []
    hypothesis: str = ""
    tags: list[str] = []
    content: str


class System(BaseModel):
    model_config = ConfigDict(extra="forbid")

    slug: str
    name: dict[str, str]
    services: dict[str, Service]
    metrics: dict[str, dict[str, str]] = Field(default_factory=dict)
    knowledge: list[KnowledgeItem] = []

    def callers(self, service: str) -> list[str]:
        return sorted(s for s, spec in self.services.items() if service in spec.depends_on)

    def dependencies(self, service: str) -> list[str]:
        spec = self.services.get(service)
        return list(spec.depends_on) if spec else []

    def kind(self, service: str) -> str:
        spec = self.services.get(service)
        return spec.kind if spec else "service"

    def topology(self, service: str) -> dict[str, list[str]]:
        return {"callers": self.callers(service), "depends_on": self.dependencies(service)}


def load_system(path: Path) -> System:
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    return System.model_validate(
        {
            **raw["system"],
            "services": raw["services"],
            "metrics": raw.get("metrics", {}),
            "knowledge": raw.get("knowledge", []),
        }
    )


@cache
def demo_shop() -> System:
    """The demo system the pack ships (seed data; admins edit the loaded copy)."""
    return load_system(DATA / "shop.yaml")
