"""AERO's settings with a channel layer that drops notices: channels_redis's core layer
(per-channel capacity, AERO_TEST_CHANNEL_CAPACITY, default 2) instead of the pub/sub
layer production uses (whose per-channel queue has no bound). For the slow-viewer fault
test (tests/faults/test_slow_viewer.py): daphne and the process appending events both
run with it, so notices past the capacity are dropped."""

from __future__ import annotations

import os

from aero.settings import *  # noqa: F403
from aero.settings import AERO_CHANNEL_PREFIX, REDIS_URL

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            # redis-py 8 reads with a 5 s socket timeout by default, the core layer's
            # BZPOPMIN blocks for 5 s: the read timed out on an idle channel and the
            # consumer closed the socket with 1011. A longer socket timeout than the pop.
            "hosts": [{"address": REDIS_URL, "socket_timeout": 30}],
            "prefix": AERO_CHANNEL_PREFIX,
            "capacity": int(os.environ.get("AERO_TEST_CHANNEL_CAPACITY", "2")),
        },
    }
}
