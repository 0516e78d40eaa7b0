from __future__ import annotations

import pytest
from django.core.management import call_command


@pytest.mark.services
def test_cli_example_one(builtin: None, capsys: pytest.CaptureFixture[str]) -> None:
    call_command(
        "incident",
        "run",
        "--scenario",
        "oil_spill",
        "--message",
        "CA1234 在105机位燃油泄漏，发动机仍在运转，还在持续漏",
        "--decide",
        "approve",
        "--json",
    )
    out = capsys.readouterr().out
    assert '"status": "completed"' in out
