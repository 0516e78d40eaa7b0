from __future__ import annotations

from typing import Any

from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "api"
    verbose_name = "API and tokens"

    def ready(self) -> None:
        from aero import serving

        serving.add_socket_app("/ws/api/", api_websocket)


def api_websocket() -> Any:
    from api.routing import api_websocket

    return api_websocket
