"""The suite's WhiteNoise middleware scans the static finders once per test process
(tests/static_scan.py): a middleware made later reuses the scan, finds the same files and
serves them."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from whitenoise.middleware import WhiteNoiseMiddleware

from tests import static_scan


def test_a_later_middleware_reuses_the_scan_and_finds_the_same_files(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scans: list[Any] = []
    scan = static_scan._scan  # WhiteNoise's own

    def counted(middleware: WhiteNoiseMiddleware) -> None:
        scans.append(middleware)
        scan(middleware)

    monkeypatch.setattr(WhiteNoiseMiddleware, "add_files_from_finders", counted)
    scanned = WhiteNoiseMiddleware(lambda request: None).files  # as WhiteNoise does alone
    monkeypatch.setattr(static_scan, "_found", {})
    monkeypatch.setattr(static_scan, "_scan", counted)
    with static_scan.kept():
        first = WhiteNoiseMiddleware(lambda request: None).files
        later = WhiteNoiseMiddleware(lambda request: None).files
    assert len(scans) == 2  # the plain middleware's, then the kept scan's only
    assert "/static/aero/aero.js" in scanned
    assert set(first) == set(later) == set(scanned)
    assert all(later[url] is first[url] for url in first)


def test_a_fresh_client_serves_a_static_file() -> None:
    for _ in range(2):
        response = Client().get("/static/aero/aero.js")
        assert response.status_code == 200
        assert b"".join(response.streaming_content)  # type: ignore[attr-defined]
