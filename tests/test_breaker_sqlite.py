"""The provider breaker in embedded mode (SQLite): a job's step holds the one write lock
from its BEGIN IMMEDIATE, so the breaker's count must not wait for another connection
(scenarios_admin/breaker.py; the PostgreSQL behaviour is tests/test_provider_breaker.py's)."""

from __future__ import annotations

from pathlib import Path

from tests.servers import run_embedded

COUNT_IN_A_STEP = """
import django
django.setup()
from django.core.management import call_command
from django.db import transaction
for app in ("aero", "scenarios_admin"):
    call_command("migrate", app, verbosity=0)
from scenarios_admin import breaker
from scenarios_admin.models import ProviderConfig, ProviderHealth
provider = ProviderConfig.objects.create(name="p", kind="offline", model="m")
with transaction.atomic():
    ProviderConfig.objects.filter(pk=provider.pk).update(enabled=True)
    admission = breaker.admit(provider.pk, 30)
    outcome = breaker.failed(provider.pk, "4xx", 429, "HTTP 429", admission.probe)
print(outcome or "-", ProviderHealth.objects.get(provider_id=provider.pk).failures)
"""


def test_a_failure_counted_inside_a_step_on_sqlite_does_not_wait_for_the_lock(
    tmp_path: Path,
) -> None:
    """On another connection the count waited out SQLite's 20 s timeout for the lock the
    step holds, then failed the step ("database is locked"; the README's simulated demo
    stalled at its first 429)."""
    run = run_embedded(tmp_path, "-c", COUNT_IN_A_STEP, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["-", "1"]
