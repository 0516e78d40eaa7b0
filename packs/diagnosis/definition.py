"""The diagnosis scenario definition: the envelope every kind shares
(scenarios_admin.schema) plus the offline playbook (DIAGNOSIS.md §3) as data, so a
session pins the thresholds, hypotheses, actions and texts it ran with."""

from __future__ import annotations

from typing import Literal

from packs.diagnosis.playbook_data import Playbook
from scenarios_admin.schema import DefinitionBase, FieldSpec


class DiagnosisDefinition(DefinitionBase[FieldSpec]):
    kind: Literal["diagnosis"]
    playbook: Playbook
