"""Test settings: PostgreSQL + Redis on this machine, a Redis database of the tests' own
(so a running dev worker cannot steal their jobs) and jobs run inline on commit.

Without AERO_REQUIRE_SERVICES=1 and with PostgreSQL unreachable, the suite falls back to
SQLite and the tests marked `services` are skipped; CI sets AERO_REQUIRE_SERVICES=1.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

import psycopg

# Long enough for production mode (weak keys are refused), and not secret.
os.environ.setdefault(
    "AERO_SECRET_KEY", "aero-tests-not-secret-0123456789-abcdefghijklmnopqrstuvwxyz"
)
# Production mode (DATABASE_URL) needs the encryption keys; a fixed one for the tests.
os.environ.setdefault("AERO_ENCRYPTION_KEYS", "aero-tests-encryption-key-not-secret")
# The tests talk plain http to PostgreSQL-mode servers (production mode turns HTTPS on).
os.environ.setdefault("AERO_HTTPS", "0")
# Playwright's sync API leaves an event loop in the main thread; the ORM calls around it
# are still plain synchronous test code.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
REQUIRE_SERVICES = os.environ.get("AERO_REQUIRE_SERVICES") == "1"
TEST_DATABASE_URL = os.environ.get("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/aero")
# 14: `make test`'s two workers use 14 and 15, never the development database 0.
TEST_REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/14")
# pytest-xdist runs the suite in worker processes (gw0, gw1, ...). Each worker
# is a run of its own: its own test database, Redis database, queue and channel prefix,
# data directory (the metrics files daphne sums) and scratch databases, so two workers
# never read each other's jobs, notices or rows.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")


def _worker_redis_url(url: str, worker: str) -> str:
    """The Redis database after TEST_REDIS_URL's, one per worker (gw0 keeps it; 16
    databases wrap around): workers never share rq's registries or channel groups."""
    if not worker:
        return url
    parts = urlsplit(url)
    base = int(parts.path.strip("/") or 0)
    return parts._replace(path=f"/{(base + int(worker.removeprefix('gw'))) % 16}").geturl()


TEST_REDIS_URL = _worker_redis_url(TEST_REDIS_URL, XDIST_WORKER)


def _postgres_up(url: str) -> bool:
    maintenance_db = urlsplit(url)._replace(path="/postgres").geturl()
    try:
        psycopg.connect(maintenance_db, connect_timeout=2).close()
    except psycopg.Error:
        return False
    return True


SERVICES_UP = _postgres_up(TEST_DATABASE_URL)
if SERVICES_UP or REQUIRE_SERVICES:
    os.environ["DATABASE_URL"] = TEST_DATABASE_URL
else:
    os.environ.pop("DATABASE_URL", None)
os.environ["REDIS_URL"] = TEST_REDIS_URL
os.environ["AERO_JOB_BACKEND"] = "inline"
# The suite's own process keeps one plain connection per thread: pytest-django holds a
# test's connection for the whole test (its transaction), and a thread a test starts and
# never closes would keep a pooled connection out of the pool for good. The servers and
# workers the suite starts run through the pool as production does (tests/servers.py
# drops AERO_ settings; tests/test_db_pool.py).
os.environ["AERO_DB_POOL"] = "0"
# Parallel runs (CI and a developer, several checkouts) share Redis databases: each run
# gets its own queue and channel prefix, named after its test database.
TEST_DB_NAME = os.environ.get("AERO_TEST_DB", "test_aero")
if XDIST_WORKER:
    # The name every worker-owned thing derives from (tests/conftest.py keeps
    # pytest-django from suffixing it a second time).
    TEST_DB_NAME = f"{TEST_DB_NAME}_{XDIST_WORKER}"
os.environ["AERO_CHANNEL_PREFIX"] = f"aero-{TEST_DB_NAME}"
os.environ["AERO_QUEUE"] = f"aero-{TEST_DB_NAME}"
os.environ.setdefault(
    "AERO_DATA_DIR", str(Path(__file__).resolve().parent.parent / "var" / "test" / XDIST_WORKER)
)

from aero.settings import *  # noqa: E402,F403

AERO_LLM_BACKOFF = 0.01
AERO_JOB_BACKOFF = 0.0
AERO_TOOL_BACKOFF = 0.0
AERO_ENRICHMENT_TIMEOUT = 1.0
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# The suite signs in and calls the API from one address far more often than a person:
# the limits are counted (the code runs) but high; tests/test_rate_limits.py lowers them.
AERO_RATE_LIMITS = {scope: 1_000_000 for scope in AERO_RATE_LIMITS}  # noqa: F405
# The flush between tests removes rows the anchors name: tests/test_anchors.py turns
# anchoring on, with a file of its own.
AERO_ANCHOR_EVERY = 0

# Parallel runs on one machine (several checkouts, CI and a developer) need their own
# test database; the name also reaches subprocesses through DATABASE_URL.
DATABASES["default"]["TEST"] = {"NAME": TEST_DB_NAME}  # noqa: F405

# The tests about behaviour read the English interface; the product's default
# (aero.settings: zh-hans) and the Chinese texts have tests of their own
# (tests/test_i18n.py), which switch to it explicitly.
LANGUAGE_CODE = "en"
