from __future__ import annotations

from channels.routing import URLRouter
from django.urls import path

from api.consumers import ApiSessionStream

websocket_urlpatterns = [
    path("ws/api/sessions/<uuid:session_id>", ApiSessionStream.as_asgi()),
    path("ws/api/sessions/<uuid:session_id>/", ApiSessionStream.as_asgi()),
]
api_websocket = URLRouter(websocket_urlpatterns)
