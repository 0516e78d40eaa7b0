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


def warm_up_live() -> None:
    """Paid at start, not by the first live push: the release digest the shared renders
    are keyed by (aero.release reads every source file), the template engine's tag
    libraries and the session page's templates compiled. py-spy: ~0.3 s of a daphne's CPU
    in its first fan-out, which every viewer of that event waited for."""
    from django.template.loader import get_template

    from aero.release import release

    release()
    for name in LIVE_TEMPLATES:
        get_template(name)


# What a live update renders: the timeline's rows, the panels (the page's template).
LIVE_TEMPLATES = (
    "diagnosis/_timeline_append.html",
    "diagnosis/_event.html",
    "diagnosis/_event_lines.html",
    "diagnosis/session_detail.html",
)


def _warm_up_live_in_background() -> None:
    try:
        warm_up_live()
    except Exception:  # the first push pays for it then
        logger.warning("warm-up: the live renders' templates failed", exc_info=True)


def web_started(server: Server) -> None:
    if server == "asgi":
        # On a thread, as the imports below: the server listens meanwhile.
        threading.Thread(
            target=_warm_up_live_in_background, daemon=True, name="aero-warm-up-live"
        ).start()
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
