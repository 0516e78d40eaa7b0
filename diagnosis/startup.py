"""What a web process starts with (registered with aero.serving by this app)."""

from __future__ import annotations

import logging
import threading

from django.conf import settings

from aero.serving import Server

logger = logging.getLogger("diagnosis.startup")


def warm_up_imports() -> None:
    """Paid at start, not by the first new session's request: it records its extraction
    request through LangChain's OpenAI client, and a graph node's first run imports the
    ReAct step; each import takes about a second."""
    from diagnosis.agent import react  # noqa: F401
    from diagnosis.agent.clients import warm_up_imports as client_imports

    client_imports()


def _warm_up_in_background() -> None:
    try:
        warm_up_imports()
    except Exception:  # the first session's request imports them itself then
        logger.warning("warm-up: the model client imports failed", exc_info=True)


def web_started(server: Server) -> None:
    if server == "asgi" and settings.AERO_JOB_BACKEND != "rq":
        # Only where daphne serves the pages and calls the model: with rq it serves
        # WebSockets alone (gunicorn the pages, workers the model), so the imports would
        # only take CPU from the first pushes after a restart. On a thread: the server
        # listens meanwhile; a request that needs them first waits for them as it did.
        threading.Thread(target=_warm_up_in_background, daemon=True, name="aero-warm-up").start()
    if server == "asgi" and settings.AERO_JOB_BACKEND == "embedded":
        # Embedded mode: start the in-process worker now, so sessions a restart
        # interrupted are picked up by the reconciler without waiting for a request.
        from diagnosis.jobs import embedded_worker

        embedded_worker()
    elif settings.AERO_JOB_BACKEND == "rq":
        # The approval sweeper runs in the web processes too (each gunicorn worker after
        # the fork): timeouts happen with every job worker down.
        from diagnosis.maintenance import start_web_ticker

        start_web_ticker()
