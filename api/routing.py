from __future__ import annotations

from channels.routing import URLRouter
from django.urls import path

from api.consumers import ApiSessionStream

# Any id is routed: the stream refuses a malformed one with a close code and reason
# (4400), where an unmatched route would fail the handshake with an HTTP 500.
websocket_urlpatterns = [
    path("ws/api/sessions/<str:session_id>", ApiSessionStream.as_asgi()),
    path("ws/api/sessions/<str:session_id>/", ApiSessionStream.as_asgi()),
]
api_websocket = URLRouter(websocket_urlpatterns)
