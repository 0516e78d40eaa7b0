from __future__ import annotations

import os
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "aero.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402

from api.routing import api_websocket  # noqa: E402
from approvals.routing import websocket_urlpatterns as approval_sockets  # noqa: E402
from diagnosis.routing import websocket_urlpatterns as session_sockets  # noqa: E402

# Pages' sockets use the login cookie, so they check the Origin; the API stream uses a
# token (no ambient credential) and serves clients that send no Origin at all.
page_websocket = AllowedHostsOriginValidator(
    AuthMiddlewareStack(URLRouter(session_sockets + approval_sockets))
)


async def websocket(scope: Any, receive: Any, send: Any) -> None:
    app = api_websocket if scope["path"].startswith("/ws/api/") else page_websocket
    await app(scope, receive, send)


application = ProtocolTypeRouter({"http": django_asgi_app, "websocket": websocket})

# Paid at start, not by the first new session's request: it records its extraction
# request through LangChain's OpenAI client, whose import took ~1 s here (ADR 183).
from diagnosis.agent.providers import warm_up_imports  # noqa: E402

warm_up_imports()

if settings.AERO_JOB_BACKEND == "embedded":
    # Embedded mode: start the in-process worker now, so sessions a restart interrupted
    # are picked up by the reconciler without waiting for the next request.
    from diagnosis.jobs import embedded_worker

    embedded_worker()
elif settings.AERO_JOB_BACKEND == "rq":
    # The approval sweeper runs in the web processes too: timeouts happen with every
    # worker down (ADR 112).
    from diagnosis.maintenance import start_web_ticker

    start_web_ticker()
