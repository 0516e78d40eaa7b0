from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "aero.settings")
application = get_wsgi_application()

from django.conf import settings  # noqa: E402

if settings.AERO_JOB_BACKEND == "rq":
    # Each gunicorn worker imports this module after the fork: its own sweeper thread, so
    # approval timeouts happen with every job worker down (ADR 112).
    from diagnosis.maintenance import start_web_ticker

    start_web_ticker()
