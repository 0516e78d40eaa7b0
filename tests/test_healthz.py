"""/healthz: for load balancers and the run scripts, so it needs no login."""

from __future__ import annotations

import pytest
from django.db import OperationalError
from django.test import Client

from aero import views


def test_healthz_is_ok_without_login(db: None) -> None:
    response = Client().get("/healthz")

    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert response.json() == {"ok": True}


def test_healthz_reports_a_database_outage(db: None, monkeypatch: pytest.MonkeyPatch) -> None:
    class Down:
        def cursor(self) -> None:
            raise OperationalError("connection refused")

    monkeypatch.setattr(views, "connection", Down())

    response = Client().get("/healthz")

    assert response.status_code == 503
    assert response.json() == {"ok": False, "database": "connection refused"}
