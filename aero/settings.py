"""AERO settings: everything comes from the environment, with an embedded default.

Embedded default (nothing set): SQLite file, in-process job worker, in-memory channel
layer, offline LLM provider. Production: DATABASE_URL (PostgreSQL) + REDIS_URL (django-rq
workers and channels_redis).
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

import dj_database_url
import django_stubs_ext
from django.core.exceptions import ImproperlyConfigured
from django.utils.csp import CSP

from aero.env import env_bool, env_choice, env_float, env_int, env_list, env_str

# Generic admin/queryset classes (ModelAdmin[Model]) at run time, as the type stubs see them.
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(env_str("AERO_DATA_DIR", str(BASE_DIR / "var")))


def _secret_key() -> str:
    configured = env_str("AERO_SECRET_KEY")
    if configured:
        return configured
    # Embedded mode keeps a generated key on disk so logins survive a restart.
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    key_file = DATA_DIR / "secret_key"
    if not key_file.exists():
        key_file.write_text(secrets.token_urlsafe(50))
    return key_file.read_text().strip()


SECRET_KEY = _secret_key()
DEBUG = env_bool("AERO_DEBUG", False)
ALLOWED_HOSTS = env_list("AERO_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("AERO_CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_htmx",
    "django_rq",
    "ninja",
    "aero",
    "scenarios_admin",
    "diagnosis",
    "approvals",
    "replay",
    "ingest",
    "api",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "aero.audit_trail.CurrentActorMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "api.middleware.ApiAuditMiddleware",
]

# Content Security Policy on every response (admin included): scripts and styles only
# from our own static files (htmx is vendored and configured in base.html to need no
# eval and no inline style), no inline handlers, no plugins, no framing, forms post
# only here. A template that truly needs an inline block uses {% csp_nonce_attr %}.
SECURE_CSP: dict[str, list[str]] = {
    "default-src": [CSP.SELF],
    "script-src": [CSP.SELF, CSP.NONCE],
    "style-src": [CSP.SELF, CSP.NONCE],
    "img-src": [CSP.SELF],
    "font-src": [CSP.SELF],
    # 'self' covers the same-origin ws:/wss: of the live timeline (CSP level 3).
    "connect-src": [CSP.SELF],
    "object-src": [CSP.NONE],
    "base-uri": [CSP.NONE],
    "frame-ancestors": [CSP.NONE],
    "form-action": [CSP.SELF],
}

ROOT_URLCONF = "aero.urls"
ASGI_APPLICATION = "aero.asgi.application"
WSGI_APPLICATION = "aero.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "django.template.context_processors.csp",
                "aero.roles.roles_context",
                "aero.live.live_context",
            ],
        },
    },
]

# --- database -------------------------------------------------------------------------
DATABASE_URL = env_str("DATABASE_URL")
if DATABASE_URL:
    # Persistent connections, checked before reuse: a new PostgreSQL connection per
    # request or consumer pull cost ~11% of the ASGI process (see docs/decisions.md, ADR 81).
    DATABASES = {
        "default": dj_database_url.parse(
            DATABASE_URL,
            conn_max_age=env_int("AERO_DB_CONN_MAX_AGE", 300, minimum=0),
            conn_health_checks=True,
        )
    }
else:
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(DATA_DIR / "aero.sqlite3"),
            # The embedded worker thread and web requests write concurrently: wait for
            # the lock instead of failing, and use WAL so readers never block writers.
            "OPTIONS": {
                "timeout": 20,
                "transaction_mode": "IMMEDIATE",
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }
DB_VENDOR = "postgresql" if DATABASE_URL.startswith(("postgres", "postgis")) else "sqlite"
if DATABASE_URL and DB_VENDOR != "postgresql":
    raise ImproperlyConfigured("DATABASE_URL must point at PostgreSQL (or be unset for SQLite)")

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- redis, jobs, channels ------------------------------------------------------------
REDIS_URL = env_str("REDIS_URL")
AERO_JOB_BACKEND = env_choice(
    "AERO_JOB_BACKEND", "rq" if REDIS_URL else "embedded", ("embedded", "rq", "inline")
)
if AERO_JOB_BACKEND == "rq" and not REDIS_URL:
    raise ImproperlyConfigured("AERO_JOB_BACKEND=rq needs REDIS_URL")
AERO_EMBEDDED_WORKERS = env_int("AERO_EMBEDDED_WORKERS", 2, minimum=1)
# A job holds a lease on its session; a lease older than this is considered abandoned
# (worker killed) and the reconciler re-enqueues the session.
AERO_LEASE_SECONDS = env_int("AERO_LEASE_SECONDS", 120, minimum=5)
AERO_RECONCILE_SECONDS = env_int("AERO_RECONCILE_SECONDS", 30, minimum=1)
AERO_JOB_ATTEMPTS = env_int("AERO_JOB_ATTEMPTS", 3, minimum=1)
AERO_JOB_BACKOFF = env_float("AERO_JOB_BACKOFF", 1.0)  # seconds x attempt, between retries
AERO_QUEUE = env_str("AERO_QUEUE", "aero")
AERO_CHANNEL_PREFIX = env_str("AERO_CHANNEL_PREFIX", "aero")
# Where pages open their WebSockets when HTTP and WebSockets are served by different
# processes (scripts/run.sh in production: gunicorn for HTTP, daphne for WebSockets),
# e.g. "ws://127.0.0.1:8001". Empty: the page's own origin.
AERO_WS_URL = env_str("AERO_WS_URL").rstrip("/")
if AERO_WS_URL:
    SECURE_CSP["connect-src"] = [CSP.SELF, AERO_WS_URL]  # the sockets' own origin

RQ_QUEUES = {
    AERO_QUEUE: {"URL": REDIS_URL or "redis://127.0.0.1:6379/0", "DEFAULT_TIMEOUT": 600},
}

if REDIS_URL:
    # The pub/sub layer reconnects after a Redis restart (the core layer closes every
    # consumer with 1011); redis-py 8 caps the async pool at 100 connections.
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {
                "hosts": [{"address": REDIS_URL, "max_connections": 2000}],
                "prefix": AERO_CHANNEL_PREFIX,
            },
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# --- agent ----------------------------------------------------------------------------
# Replay: cached fold checkpoints and export jobs (progress, finished Markdown), shared by
# web and workers through Redis in production; per process in embedded mode.
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "replay": (
        {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": AERO_CHANNEL_PREFIX,
        }
        if REDIS_URL
        else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "replay"}
    ),
}
# Which payload fields read-only viewers see masked (replay/masking.py): JSON list of rules.
try:
    AERO_REPLAY_MASK = json.loads(env_str("AERO_REPLAY_MASK", "null"))
except ValueError as exc:
    raise ImproperlyConfigured(f"AERO_REPLAY_MASK is not JSON: {exc}") from None
# Sessions with more events than this export in the background, with visible progress.
AERO_REPLAY_EXPORT_INLINE_EVENTS = env_int("AERO_REPLAY_EXPORT_INLINE_EVENTS", 5000, minimum=0)
# Replay pages verify the hash chain inline up to this many events, on demand above it.
AERO_REPLAY_CHAIN_INLINE_EVENTS = env_int("AERO_REPLAY_CHAIN_INLINE_EVENTS", 2000, minimum=0)

AERO_ENRICHMENT_TIMEOUT = env_float("AERO_ENRICHMENT_TIMEOUT", 2.0)
AERO_LLM_RETRIES = env_int("AERO_LLM_RETRIES", 3, minimum=1)
AERO_LLM_BACKOFF = env_float("AERO_LLM_BACKOFF", 1.0)
# With a real provider configured, the model picks the reasoning node's calls (ReAct),
# checked by the compliance policy; off: the deterministic planner alone.
AERO_LLM_REACT = env_bool("AERO_LLM_REACT", True)
AERO_CHECKPOINT_SQLITE = Path(
    env_str("AERO_CHECKPOINT_SQLITE", str(DATA_DIR / "checkpoints.sqlite3"))
)
AERO_ENCRYPTION_KEY = env_str("AERO_ENCRYPTION_KEY")
# The key of the audit log's HMAC chain (aero.audit_chain). Without it, one derived from
# SECRET_KEY: every process of a deployment must share it, or verify_audit fails.
AERO_AUDIT_KEY = env_str("AERO_AUDIT_KEY")

# --- approvals ------------------------------------------------------------------------
# Deadlines per risk class; an expired approval becomes a manual to-do, never approved.
AERO_APPROVAL_TIMEOUT_MINUTES = {
    "R1": env_int("AERO_TIMEOUT_R1_MINUTES", 15, minimum=1),
    "R2": env_int("AERO_TIMEOUT_R2_MINUTES", 10, minimum=1),
    "R3": env_int("AERO_TIMEOUT_R3_MINUTES", 5, minimum=1),
}
# Two-person rule: R2/R3 need two different approvers, neither the session's creator.
AERO_TWO_PERSON_RULE = env_bool("AERO_TWO_PERSON_RULE", False)

# --- auth, i18n, static ---------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "diagnosis:session-list"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en"
TIME_ZONE = env_str("AERO_TIME_ZONE", "Asia/Shanghai")
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / "staticfiles"
# Finders serve from STATICFILES_DIRS when collectstatic has not run (tests, dev).
WHITENOISE_USE_FINDERS = True

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "aero": {"handlers": ["console"], "level": env_str("AERO_LOG_LEVEL", "INFO")},
        "diagnosis": {"handlers": ["console"], "level": env_str("AERO_LOG_LEVEL", "INFO")},
        "ingest": {"handlers": ["console"], "level": env_str("AERO_LOG_LEVEL", "INFO")},
        "api": {"handlers": ["console"], "level": env_str("AERO_LOG_LEVEL", "INFO")},
    },
}

# --- API, ingest, metrics -------------------------------------------------------------
# Idempotency keys of POST /api/v1/diagnosis-sessions are honoured this long.
AERO_IDEMPOTENCY_HOURS = env_int("AERO_IDEMPOTENCY_HOURS", 24, minimum=1)
# A token's last_used_at is written at most this often (one UPDATE per call otherwise).
AERO_TOKEN_TOUCH_SECONDS = env_int("AERO_TOKEN_TOUCH_SECONDS", 60, minimum=0)
# Alert sources without an API token send this shared secret (header X-Aero-Ingest-Secret or
# ?secret=); empty disables the secret, tokens still work.
AERO_INGEST_SECRET = env_str("AERO_INGEST_SECRET")
# Sessions opened by alerts that came in with the shared secret belong to this user.
AERO_INGEST_USERNAME = env_str("AERO_INGEST_USERNAME", "alertmanager")
# Optional YAML file of gate rules, watched by stamp (mtime_ns + size) and hash.
AERO_GATE_FILE = env_str("AERO_GATE_FILE")
# /metrics: a bearer token, or a client address from this list (loopback by default).
AERO_METRICS_TOKEN = env_str("AERO_METRICS_TOKEN")
AERO_METRICS_ALLOWED_IPS = env_list("AERO_METRICS_ALLOWED_IPS", ["127.0.0.1", "::1"])
# prometheus-client's multi-process mode (daphne, rq workers and their forked jobs write
# their own files here; /metrics sums them). It must be set before prometheus_client is
# imported, which no module does before settings load.
PROMETHEUS_MULTIPROC_DIR = Path(
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", str(DATA_DIR / "metrics"))
)
PROMETHEUS_MULTIPROC_DIR.mkdir(parents=True, exist_ok=True)
