from __future__ import annotations

import os

from django.conf import settings
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "aero.settings")
if not settings.configured:
    # This process is the ASGI server (not a test importing the app): the settings then
    # keep no idle database connection (docs/operations.md).
    os.environ["AERO_ASGI_PROCESS"] = "1"
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter  # noqa: E402

from aero import serving  # noqa: E402

ASGI_YOUNG_THRESHOLD = 50_000

# The apps registered their sockets and start hooks when Django loaded them (above).
page_websocket = serving.page_websocket()
application = ProtocolTypeRouter(
    {"http": django_asgi_app, "websocket": serving.websocket(page_websocket)}
)
serving.started("asgi")
if settings.ASGI_PROCESS:
    # The server itself, not a test importing the app: its start-up is frozen. With
    # thousands of sockets a full collection walks them all (~0.5 s at 5,000): at the
    # default 700 a fan-out's objects in flight were promoted at each young collection
    # until one fell due (Python's 25 % rule) in the middle of the events.
    serving.freeze_start_up(young=ASGI_YOUNG_THRESHOLD)
