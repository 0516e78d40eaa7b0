from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "aero.settings")
application = get_wsgi_application()

from aero import serving  # noqa: E402

# Each gunicorn worker imports this module after the fork: its start hooks run in it.
serving.started("wsgi")
serving.freeze_start_up()
