"""What the database's owner creates itself before the app's role gets its rights
(`manage.py db_roles`): tables no migration makes, such as LangGraph's checkpoints,
registered by the apps that use them from their AppConfig.ready()."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Each is given the owner's connection parameters (psycopg.connect's keywords).
OwnerSetup = Callable[[dict[str, Any]], None]

_setups: list[OwnerSetup] = []


def register(setup: OwnerSetup) -> None:
    if setup not in _setups:
        _setups.append(setup)


def setups() -> list[OwnerSetup]:
    return list(_setups)
