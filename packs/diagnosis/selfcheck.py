"""The diagnosis scenario's example cases: the shipped example bundles run through a
definition's playbook and compared with their expected results (`manage.py scenario
check it_diagnosis`), as the apron's example sentences are."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from packs.diagnosis.bundle import opened
from packs.diagnosis.playbook import diagnose
from packs.diagnosis.playbook_data import Playbook
from packs.diagnosis.system import demo_shop

EXAMPLES = Path(__file__).resolve().parent / "data" / "examples"


@dataclass
class ExampleCase:
    number: int
    name: str
    found: str
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        return f"{self.name}: {self.found}"


def check_examples(definition: dict[str, Any]) -> list[ExampleCase]:
    playbook = Playbook.model_validate(definition["playbook"])
    expected: dict[str, Any] = yaml.safe_load((EXAMPLES / "expected.yaml").read_text("utf-8"))
    cases = []
    for number, (name, want) in enumerate(sorted(expected.items()), start=1):
        with opened(EXAMPLES / f"{name}.tar.gz") as bundle:
            found = diagnose(bundle, demo_shop(), playbook)
        got = {
            "hypothesis": found.hypothesis,
            "service": found.service,
            "deploy": found.deploy,
            "code": (found.code_locations[0].path, found.code_locations[0].line)
            if found.code_locations
            else None,
            "action": (
                (found.action["tool"], found.action["args"]["service"], found.action["risk_class"])
                if found.action
                else None
            ),
        }
        wanted = {
            "hypothesis": want["hypothesis"],
            "service": want["service"],
            "deploy": want.get("deploy"),
            "code": (want["code_path"], want["code_line"]) if "code_path" in want else None,
            "action": (
                want["action"]["tool"],
                want["action"]["service"],
                want["action"]["risk_class"],
            ),
        }
        problems = [
            f"{key}: expected {wanted[key]}, found {got[key]}"
            for key in wanted
            if got[key] != wanted[key]
        ]
        words = f"{found.hypothesis} on {found.service or '-'} ({found.confidence})"
        cases.append(ExampleCase(number, name, words, problems))
    return cases
