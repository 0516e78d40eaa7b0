"""What /healthz checks beyond the database and Redis, registered by the apps from their
AppConfig.ready(), so the kernel names no app."""

from __future__ import annotations

from collections.abc import Callable

Probe = Callable[[], str]  # returns what it found; raises when unhealthy

_probes: list[tuple[str, Probe, Callable[[], bool]]] = []


def register(name: str, probe: Probe, *, when: Callable[[], bool]) -> None:
    """`probe` runs on each /healthz request for which `when()` holds, in the order the
    probes were registered."""
    if all(known != name for known, _, _ in _probes):
        _probes.append((name, probe, when))


def probes() -> list[tuple[str, Probe]]:
    return [(name, probe) for name, probe, when in _probes if when()]
