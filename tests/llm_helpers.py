"""The simulated OpenAI-compatible server as a fixture: real HTTP on a free port, in a
thread of the test process; a test scripts it with `fake_llm.set_script({...})`."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest

from diagnosis.agent.fake_llm import FakeLLMServer
from scenarios_admin.models import ProviderConfig


@pytest.fixture
def fake_llm() -> Iterator[FakeLLMServer]:
    server = FakeLLMServer().start()
    yield server
    server.stop()


def fake_provider(server: FakeLLMServer, name: str = "fake", **extra: Any) -> ProviderConfig:
    """An enabled provider config pointing at the fake server (priced, keyed)."""
    values: dict[str, Any] = {
        "name": name,
        "kind": "openai",
        "base_url": server.url,
        "model": "fake-1",
        "price_input_per_1k": Decimal("0.01"),
        "price_output_per_1k": Decimal("0.02"),
        "timeout_seconds": 5,
    }
    values.update(extra)
    config = ProviderConfig(**values)
    config.set_api_key("sk-test-123")
    config.save()
    return config
