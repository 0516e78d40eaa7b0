"""The schema is the contract: schemathesis generates requests for every operation from
/api/v1/openapi.json, valid and invalid ones, and sends them to AERO served by daphne
(another process), running every check it has (the CLI's `--checks all`: status codes,
content types, headers, bodies, negative data refused, positive data accepted, auth,
unsupported methods). Path ids point at a real session and approval half of the time, so
success bodies are checked too. Bounded: a few examples per operation and mode."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
import schemathesis
from django.contrib.auth.models import User
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import CHECKS, load_all_checks

from approvals.models import Approval
from tests.api_helpers import token_for
from tests.web_helpers import waiting_session

pytestmark = pytest.mark.services


@pytest.fixture
def live_api(builtin: None, asgi_server: str, make_user: Callable[..., User]) -> dict[str, Any]:
    admin = make_user("schema-admin", "admin")
    session = waiting_session(make_user("schema-operator", "operator"))
    approval = Approval.objects.filter(session=session).order_by("pk").first()
    assert approval is not None
    return {
        "token": token_for(admin),
        "session_id": str(session.pk),
        "approval_id": approval.pk,
        "schema": schemathesis.openapi.from_url(f"{asgi_server}/api/v1/openapi.json"),
        "base": asgi_server,
    }


def test_api_matches_its_schema(live_api: dict[str, Any]) -> None:
    """One hypothesis run per operation (schemathesis' lazy pytest loader does not run on
    pytest 9, so the operations are walked here); every failure is reported at the end."""
    chooser = random.Random(13)
    headers = {"Authorization": f"Bearer {live_api['token']}"}
    failures: list[str] = []
    operations = [result.ok() for result in live_api["schema"].get_all_operations()]
    assert len(operations) == 16

    load_all_checks()
    checks = CHECKS.get_all()
    assert len(checks) >= 14, "every check schemathesis has"

    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=3,
                deadline=None,
                derandomize=True,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            def run(case: Any) -> None:
                # real ids in valid requests only: an invalid one must stay invalid
                if (
                    mode is GenerationMode.POSITIVE  # noqa: B023 (run() is called right below)
                    and case.path_parameters
                    and chooser.random() < 0.5
                ):
                    if "session_id" in case.path_parameters:
                        case.path_parameters["session_id"] = live_api["session_id"]
                    if "approval_id" in case.path_parameters:
                        case.path_parameters["approval_id"] = live_api["approval_id"]
                case.call_and_validate(base_url=live_api["base"], headers=headers, checks=checks)

            try:
                run()
            except (Exception, BaseExceptionGroup) as exc:
                failures.append(f"{operation.method.upper()} {operation.path} ({mode}): {exc}")
    assert not failures, "\n\n".join(failures)
