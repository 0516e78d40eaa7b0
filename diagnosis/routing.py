from __future__ import annotations

from django.urls import path

from diagnosis.consumers import SessionConsumer

websocket_urlpatterns = [
    path("ws/sessions/<uuid:session_id>/", SessionConsumer.as_asgi()),
]
