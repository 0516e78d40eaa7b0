"""AERO settings: everything comes from the environment, with an embedded default.

Embedded default (nothing set): SQLite file, in-process job worker, in-memory channel
layer, offline LLM provider. Production: DATABASE_URL (PostgreSQL) + REDIS_URL (django-rq
workers and channels_redis).
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import dj_database_url
import django_stubs_ext
from django.core.exceptions import ImproperlyConfigured
from django.utils.csp import CSP

from aero import keys
from aero.env import env_bool, env_choice, env_float, env_int, env_list, env_str

# Generic admin/queryset classes (ModelAdmin[Model]) at run time, as the type stubs see them.
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(env_str("AERO_DATA_DIR", str(BASE_DIR / "var")))
DATABASE_URL = env_str("DATABASE_URL")
# Production mode: PostgreSQL, possibly several hosts. Every secret must then come from
# the environment (one host's generated file would not be another's).
PRODUCTION = bool(DATABASE_URL)


SECRET_KEY = keys.secret_key(PRODUCTION, DATA_DIR)
AERO_ENCRYPTION_KEYS = keys.encryption_keys(SECRET_KEY, PRODUCTION, DATA_DIR)
DEBUG = env_bool("AERO_DEBUG", False)
ALLOWED_HOSTS = env_list("AERO_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("AERO_CSRF_TRUSTED_ORIGINS", [])

# The domain packs: every package in packs/ that is a Django app, in name order (the
# first serves where no session is at hand: a worker warming up, the shared checkpointer).
DOMAIN_PACKS = sorted(
    f"packs.{pack.name}" for pack in (BASE_DIR / "packs").iterdir() if (pack / "apps.py").is_file()
)

# Not "daphne": it only swaps runserver (unused: scripts/run.sh starts daphne itself) and
# its app imports Twisted in every process (~0.4 s of each start's CPU).
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_htmx",
    "django_rq",
    "axes",
    "ninja",
    "aero",
    "scenarios_admin",
    *DOMAIN_PACKS,
    "diagnosis",
    "approvals",
    "replay",
    "ingest",
    "tools",
    "api",
]

MIDDLEWARE = [
    # First: every log line about a request, and its response, carry the request's id.
    "aero.errors.RequestIdMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    # Django's, with the signed-in user and roles held per process between changes.
    "aero.session_store.AuthenticationMiddleware",
    # Sign-ins, visitors' posts, the API and the ingest, per client and minute.
    "aero.ratelimit.RateLimitMiddleware",
    # The user's language (after authentication: the choice lives in their session).
    "aero.i18n.UserLanguageMiddleware",
    "aero.sessions.IdleSessionMiddleware",
    "aero.audit_trail.CurrentActorMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "api.middleware.ApiAuditMiddleware",
    # Inside the audit: the status it records is the one the client gets.
    "api.middleware.JsonErrorsMiddleware",
    # Last, as django-axes asks: it turns a locked-out sign-in into the lockout page.
    "axes.middleware.AxesMiddleware",
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
        # Django's, with bidirectional controls in the output neutralised (aero.text).
        "BACKEND": "aero.template_backend.Templates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            # Every template speaks i18n ({% translate %}) and shows times with date and
            # zone (|when) without a {% load %} of its own.
            "builtins": [
                "django.templatetags.i18n",
                "aero.templatetags.aero_text",
                "diagnosis.templatetags.timeline",
            ],
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "django.template.context_processors.csp",
                "aero.roles.roles_context",
                "aero.live.live_context",
                "django.template.context_processors.i18n",
                "aero.i18n.i18n_context",
                "approvals.context.pending_context",
            ],
        },
    },
]

# --- database -------------------------------------------------------------------------
# Set by aero/asgi.py before Django loads: this process is daphne.
ASGI_PROCESS = os.environ.get("AERO_ASGI_PROCESS") == "1"
# daphne's database calls (consumers, the sign-in lookup) run on this many threads at
# once, each call on a connection opened for it and closed after it: at most this many
# connections while sockets are busy, none while they idle.
AERO_ASGI_DB_THREADS = env_int("AERO_ASGI_DB_THREADS", 8, minimum=1)
# PostgreSQL only: the pool (below) and its sizes, per process. daphne's default is its
# database threads plus the web ticker's; gunicorn gets its threads plus one from
# `make run` (scripts/run.sh); workers and the LLM runner 8 (a job, its heartbeat, the
# reconciler and a step's parallel branches each hold one while they run).
AERO_DB_POOL = env_bool("AERO_DB_POOL", True)
AERO_DB_POOL_SIZE = env_int(
    "AERO_DB_POOL_SIZE", AERO_ASGI_DB_THREADS + 1 if ASGI_PROCESS else 8, minimum=1
)
AERO_DB_POOL_TIMEOUT = env_float("AERO_DB_POOL_TIMEOUT", 10.0)
# daphne's sockets mostly idle: its unused connections go within seconds (one closed
# per AERO_DB_POOL_MAX_IDLE, psycopg's shrink step).
AERO_DB_POOL_MAX_IDLE = env_float("AERO_DB_POOL_MAX_IDLE", 2.0 if ASGI_PROCESS else 60.0)
if DATABASE_URL:
    # Persistent connections, checked before reuse: opening a PostgreSQL connection per
    # request or consumer pull is a large share of the ASGI process's CPU.
    DATABASES = {
        "default": dj_database_url.parse(
            DATABASE_URL,
            # daphne keeps none (docs/operations.md): its sockets mostly idle, and 100
            # viewers' consumers once held 30 idle connections on a server with 100.
            conn_max_age=0 if ASGI_PROCESS else env_int("AERO_DB_CONN_MAX_AGE", 300, minimum=0),
            conn_health_checks=True,
        )
    }
    # Named in pg_stat_activity, so an operator (and a test) can count each process's.
    DATABASES["default"].setdefault("OPTIONS", {})["application_name"] = env_str(
        "AERO_DB_APPLICATION_NAME", "aero-daphne" if ASGI_PROCESS else "aero"
    )
    # Connections through psycopg's pool (docs/operations.md): a process holds at most
    # AERO_DB_POOL_SIZE, whatever the number of clients (daphne serving 50 HTTP clients
    # had held 50-57 backends, one per request thread); a request finding them all busy
    # waits AERO_DB_POOL_TIMEOUT s, then answers 503. Django's pool wants CONN_MAX_AGE 0:
    # a connection goes back to the pool when the request (or db_call) ends, and one
    # unused for AERO_DB_POOL_MAX_IDLE s is closed.
    if AERO_DB_POOL:
        DATABASES["default"]["CONN_MAX_AGE"] = 0
        DATABASES["default"]["OPTIONS"]["pool"] = {
            "min_size": 0,
            "max_size": AERO_DB_POOL_SIZE,
            "timeout": AERO_DB_POOL_TIMEOUT,
            "max_idle": AERO_DB_POOL_MAX_IDLE,
        }
    # Parameters bound by the server, not pasted into the SQL text: psycopg no longer
    # quotes every literal into the text. Not prepared: Django turns psycopg's
    # prepare_threshold off unless OPTIONS sets it, and setting it (5) saved a model-bound
    # job no client CPU (bench/RESULTS.md); the checkpointer's connection prepares its own.
    DATABASES["default"].setdefault("OPTIONS", {})["server_side_binding"] = True
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
# A job holds a lease on its session, renewed by a heartbeat every AERO_HEARTBEAT_SECONDS
# while it runs; a lease not renewed for AERO_LEASE_SECONDS belonged to a dead or paused
# worker, and the next reconciler pass re-enqueues the session. Short, so a killed
# worker's session runs again within lease + reconcile interval.
AERO_LEASE_SECONDS = env_int("AERO_LEASE_SECONDS", 20, minimum=5)
AERO_HEARTBEAT_SECONDS = env_float("AERO_HEARTBEAT_SECONDS", AERO_LEASE_SECONDS / 4)
if not 0 < AERO_HEARTBEAT_SECONDS <= AERO_LEASE_SECONDS / 2:
    raise ImproperlyConfigured("AERO_HEARTBEAT_SECONDS must be at most half of the lease")
AERO_RECONCILE_SECONDS = env_int("AERO_RECONCILE_SECONDS", 5, minimum=1)
# The whole chain of model attempts of one call (retries, fallbacks) starts no attempt
# after this many seconds; each attempt's own timeout stays below the lease.
AERO_LLM_BUDGET_SECONDS = env_float("AERO_LLM_BUDGET_SECONDS", 60.0)
# Web processes (gunicorn workers, daphne) run the web periodic tasks (the approval
# timeout sweeper) this often, so timeouts happen with every worker down; 0: off.
AERO_WEB_TICK_SECONDS = env_float("AERO_WEB_TICK_SECONDS", 10.0)
AERO_JOB_ATTEMPTS = env_int("AERO_JOB_ATTEMPTS", 3, minimum=1)
AERO_JOB_BACKOFF = env_float("AERO_JOB_BACKOFF", 1.0)  # seconds x attempt, between retries
AERO_QUEUE = env_str("AERO_QUEUE", "aero")
# Workers take from this queue first, in order: sessions whose job was lost (a
# killed worker, Redis restarted) re-enqueued by the reconciler, and decided lifts.
AERO_PRIORITY_QUEUE = f"{AERO_QUEUE}-first"
AERO_CHANNEL_PREFIX = env_str("AERO_CHANNEL_PREFIX", "aero")
# Where pages open their WebSockets when HTTP and WebSockets are served by different
# processes (scripts/run.sh in production: gunicorn for HTTP, daphne for WebSockets),
# e.g. "ws://127.0.0.1:8001". Empty: the page's own origin.
AERO_WS_URL = env_str("AERO_WS_URL").rstrip("/")
# The origins (scheme://host:port) pages are served from when their sockets are elsewhere
# (AERO_WS_URL): page sockets accept their own origin, these and CSRF_TRUSTED_ORIGINS.
# By default where scripts/run.sh serves the pages (AERO_HOST, AERO_PORT).
_PAGES_AT = f"http://{env_str('AERO_HOST', '127.0.0.1')}:{env_str('AERO_PORT', '8000')}"
AERO_PAGE_ORIGINS = env_list("AERO_PAGE_ORIGINS", [_PAGES_AT] if AERO_WS_URL else [])
if AERO_WS_URL:
    SECURE_CSP["connect-src"] = [CSP.SELF, AERO_WS_URL]  # the sockets' own origin
# Live pages also re-read their sessions' last seq from PostgreSQL this often (one query
# per web process for every watched session), so an event whose notice was lost (Redis
# down, a full channel) still reaches an idle page within this bound; 0: off.
AERO_LIVE_RESYNC_SECONDS = env_float("AERO_LIVE_RESYNC_SECONDS", 5.0)
# How long a web process waits for a live fragment another process is rendering before it
# renders its own (diagnosis/live_shared.py).
AERO_LIVE_SHARE_WAIT_SECONDS = env_float("AERO_LIVE_SHARE_WAIT_SECONDS", 0.25)

_RQ_URL = REDIS_URL or "redis://127.0.0.1:6379/0"
if "socket_connect_timeout" not in _RQ_URL:
    # An unreachable Redis (not just a stopped one) must not hold a web request for the
    # OS's connect timeout (minutes): the enqueue after commit fails fast and is left to
    # the reconciler. redis-py reads the option from the URL.
    _RQ_URL += ("&" if "?" in _RQ_URL else "?") + "socket_connect_timeout=3"
RQ_QUEUES = {
    AERO_QUEUE: {"URL": _RQ_URL, "DEFAULT_TIMEOUT": 600},
    AERO_PRIORITY_QUEUE: {"URL": _RQ_URL, "DEFAULT_TIMEOUT": 600},
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


def _shared_cache(location: str, max_entries: int) -> dict[str, Any]:
    """A cache every process shares through Redis in production; in embedded mode (one
    process) the process's memory, holding at most `max_entries`."""
    if REDIS_URL:
        return {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": AERO_CHANNEL_PREFIX,
        }
    return {
        "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
        "LOCATION": location,
        "OPTIONS": {"MAX_ENTRIES": max_entries},
    }


CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    # Replay's fold checkpoints and export jobs (progress, finished Markdown). A
    # 50,000-event session keeps 500 fold checkpoints (replay/presenters.py); the
    # default 300 entries would cull them while one replay walks its steps.
    "replay": _shared_cache("replay", 5000),
    # The approval queue's incident cards and pages, rendered once per change for every
    # process (approvals/cards.py, approvals/page_cache.py): a page of 10 cards per
    # filter and language, a few hundred cover the queue.
    "queue_cards": _shared_cache("queue_cards", 2000),
    # Timeline rows, rendered once per event, language and masking for every process
    # (diagnosis/timeline_rows.py): a few pages of rows for each session watched.
    "timeline_rows": _shared_cache("timeline_rows", 5000),
    # The session page's panels, rendered once per state, roles and language for every
    # process and the live push (diagnosis/page_panels.py): seven panels per state,
    # role set and language of each session watched.
    "session_panels": _shared_cache("session_panels", 5000),
}
# Which payload fields read-only viewers see masked (diagnosis/eventlog/masking.py): JSON
# list of rules.
try:
    AERO_REPLAY_MASK = json.loads(env_str("AERO_REPLAY_MASK", "null"))
except ValueError as exc:
    raise ImproperlyConfigured(f"AERO_REPLAY_MASK is not JSON: {exc}") from None
# Sessions with more events than this export in the background, with visible progress.
AERO_REPLAY_EXPORT_INLINE_EVENTS = env_int("AERO_REPLAY_EXPORT_INLINE_EVENTS", 5000, minimum=0)
# Replay pages verify the hash chain inline up to this many events, on demand above it.
AERO_REPLAY_CHAIN_INLINE_EVENTS = env_int("AERO_REPLAY_CHAIN_INLINE_EVENTS", 2000, minimum=0)

AERO_ENRICHMENT_TIMEOUT = env_float("AERO_ENRICHMENT_TIMEOUT", 2.0)
# An action's request to its external system (the outbox): retries after the first
# attempt, linear backoff (attempt x seconds: 1 s then 2 s), tech plan §5.4.
AERO_TOOL_RETRIES = env_int("AERO_TOOL_RETRIES", 2, minimum=0)
AERO_TOOL_BACKOFF = env_float("AERO_TOOL_BACKOFF", 1.0)
# How uploaded skills are isolated (tools.sandbox): auto tries bwrap, then unshare.
AERO_SKILL_SANDBOX = env_str("AERO_SKILL_SANDBOX", "auto")
if AERO_SKILL_SANDBOX not in ("auto", "bwrap", "unshare"):
    raise ImproperlyConfigured("AERO_SKILL_SANDBOX is auto, bwrap or unshare")
AERO_LLM_RETRIES = env_int("AERO_LLM_RETRIES", 3, minimum=1)
AERO_LLM_BACKOFF = env_float("AERO_LLM_BACKOFF", 1.0)
# A provider's circuit breaker (scenarios_admin.breaker): this many failed attempts in a
# row open it; open, no call goes to it for the cool-down (seconds); then one probe call.
AERO_LLM_BREAKER_FAILURES = env_int("AERO_LLM_BREAKER_FAILURES", 3, minimum=1)
AERO_LLM_BREAKER_COOLDOWN = env_float("AERO_LLM_BREAKER_COOLDOWN", 30.0)
# With a real provider configured, the model picks the reasoning node's calls (ReAct),
# checked by the compliance policy; off: the deterministic planner alone.
AERO_LLM_REACT = env_bool("AERO_LLM_REACT", True)
# Model calls are waits: a node records the request and the job ends; the LLM
# runner (`manage.py aero_llm_runner`, or a thread of the web process in embedded mode)
# makes the calls. Off: the calls run inside the job (the blocking design; the inline
# backend, i.e. the CLI and the tests, defaults to it).
AERO_LLM_WAITS = env_bool("AERO_LLM_WAITS", AERO_JOB_BACKEND != "inline")
# A runner's claim on a request: renewed by its heartbeat; a dead runner's claim expires
# and another runner takes the request over.
AERO_LLM_CLAIM_SECONDS = env_int("AERO_LLM_CLAIM_SECONDS", 20, minimum=2)
AERO_LLM_RUNNER_CONCURRENCY = env_int("AERO_LLM_RUNNER_CONCURRENCY", 500, minimum=1)
AERO_LLM_RUNNER_POLL = env_float("AERO_LLM_RUNNER_POLL", 0.2)
# Slow tools (metrics sources, MCP servers) the runner runs at once, a thread each.
AERO_SLOW_TOOL_THREADS = env_int("AERO_SLOW_TOOL_THREADS", 128, minimum=1)
# Streamed text goes into the log at most this often per call (seconds).
AERO_LLM_STREAM_FLUSH = env_float("AERO_LLM_STREAM_FLUSH", 0.1)
# Incident bundles of diagnosis sessions, a folder per session (packs.diagnosis.storage).
AERO_BUNDLE_DIR = Path(env_str("AERO_BUNDLE_DIR", str(DATA_DIR / "bundles")))
# The largest bundle archive the web form accepts (bytes; unpacked, the bundle's own limits).
AERO_BUNDLE_MAX_UPLOAD = env_int("AERO_BUNDLE_MAX_UPLOAD", 200 * 1024 * 1024)
# One exchange with the MCP git server (start-up included), seconds.
AERO_CODE_TOOL_TIMEOUT = env_float("AERO_CODE_TOOL_TIMEOUT", 30.0)
AERO_CHECKPOINT_SQLITE = Path(
    env_str("AERO_CHECKPOINT_SQLITE", str(DATA_DIR / "checkpoints.sqlite3"))
)
# The key of the audit log's HMAC chain (aero.audit_chain). Without it, one derived from
# SECRET_KEY: every process of a deployment must share it, or verify_audit fails.
AERO_AUDIT_KEY = env_str("AERO_AUDIT_KEY")
if AERO_AUDIT_KEY and PRODUCTION:
    keys.refuse_weak("AERO_AUDIT_KEY", AERO_AUDIT_KEY, 32)
# The chains' heads, anchored outside the database every AERO_ANCHOR_EVERY entries (0:
# never) and at shutdown, appended to this file (aero.anchors).
AERO_ANCHOR_FILE = Path(env_str("AERO_ANCHOR_FILE", str(DATA_DIR / "anchors.jsonl")))
AERO_ANCHOR_EVERY = env_int("AERO_ANCHOR_EVERY", 100, minimum=0)

# --- approvals ------------------------------------------------------------------------
# Deadlines per risk class; an expired approval becomes a manual to-do, never approved.
# Timeouts handled per sweeper pass (a worker's every AERO_RECONCILE_SECONDS, a web
# process's every AERO_WEB_TICK_SECONDS): a burst of expiries becomes a few passes of
# at most this many timeouts (and session jobs), not one burst (docs/operations.md).
AERO_TIMEOUT_BATCH = env_int("AERO_TIMEOUT_BATCH", 50, minimum=1)
AERO_APPROVAL_TIMEOUT_MINUTES = {
    "R1": env_int("AERO_TIMEOUT_R1_MINUTES", 15, minimum=1),
    "R2": env_int("AERO_TIMEOUT_R2_MINUTES", 10, minimum=1),
    "R3": env_int("AERO_TIMEOUT_R3_MINUTES", 5, minimum=1),
}
# Two-person rule: R2/R3 need two different approvers, neither the session's creator.
AERO_TWO_PERSON_RULE = env_bool("AERO_TWO_PERSON_RULE", False)

# --- HTTPS, cookies, sessions ---------------------------------------------------------
# On by default in production mode, so `manage.py check --deploy` is clean; AERO_HTTPS=0
# serves plain http (local runs on PostgreSQL). Behind a TLS-terminating proxy set
# AERO_PROXY_SSL_HEADER=HTTP_X_FORWARDED_PROTO (only if the proxy sets or strips that
# header: a client could otherwise claim https).
AERO_HTTPS = env_bool("AERO_HTTPS", PRODUCTION)
SECURE_SSL_REDIRECT = AERO_HTTPS
SESSION_COOKIE_SECURE = AERO_HTTPS
CSRF_COOKIE_SECURE = AERO_HTTPS
SECURE_HSTS_SECONDS = env_int("AERO_HSTS_SECONDS", 31_536_000, minimum=0) if AERO_HTTPS else 0
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("AERO_HSTS_INCLUDE_SUBDOMAINS", True)
SECURE_HSTS_PRELOAD = env_bool("AERO_HSTS_PRELOAD", True)
_proxy_header = env_str("AERO_PROXY_SSL_HEADER")
if _proxy_header:
    SECURE_PROXY_SSL_HEADER = (_proxy_header, "https")
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
SESSION_COOKIE_HTTPONLY = True
# Django's database sessions, read by a compiled statement (aero/session_store.py).
SESSION_ENGINE = "aero.session_store"
# Idle expiry: AERO_SESSION_IDLE_MINUTES without a request ends a session (requests renew
# it, at most one write a minute: aero.sessions).
SESSION_COOKIE_AGE = env_int("AERO_SESSION_IDLE_MINUTES", 120, minimum=1) * 60

# --- sign-in rate limit (django-axes) --------------------------------------------------
# AERO_LOGIN_FAILURE_LIMIT failed sign-ins for one username from one address lock that
# pair out for AERO_LOGIN_LOCKOUT_MINUTES. Never a username alone (anyone could lock an
# approver out from elsewhere) nor an address alone (behind a proxy one address is
# everyone): an address trying many usernames meets the sign-in rate limit instead.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env_int("AERO_LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("AERO_LOGIN_LOCKOUT_MINUTES", 15, minimum=1))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "aero.views.locked_out"
# The client address: REMOTE_ADDR, unless AERO_PROXY_COUNT proxies in front set
# X-Forwarded-For (trusting it without a proxy would let a client pick its address).
AXES_IPWARE_PROXY_COUNT = env_int("AERO_PROXY_COUNT", 0, minimum=0) or None
AXES_IPWARE_META_PRECEDENCE_ORDER = (
    ("HTTP_X_FORWARDED_FOR", "REMOTE_ADDR") if AXES_IPWARE_PROXY_COUNT else ("REMOTE_ADDR",)
)

# Requests per client and minute (aero.ratelimit; 0: no limit), answered 429 with
# Retry-After above it. Sign-ins and the posts of visitors not signed in count by
# address (AERO_PROXY_COUNT as above), the API and the ingest by their credential.
AERO_RATE_LIMITS = {
    "login": env_int("AERO_RATE_LOGIN_PER_MINUTE", 30, minimum=0),
    "anonymous": env_int("AERO_RATE_ANONYMOUS_PER_MINUTE", 20, minimum=0),
    "api": env_int("AERO_RATE_API_PER_MINUTE", 600, minimum=0),
    "ingest": env_int("AERO_RATE_INGEST_PER_MINUTE", 120, minimum=0),
}

# --- auth, i18n, static ---------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "diagnosis:session-list"
LOGOUT_REDIRECT_URL = "login"

# The users are Chinese airport operations staff: zh-hans unless a user switches
# (aero.i18n; docs/i18n.md). Translations: locale/, compiled at install.
LANGUAGE_CODE = "zh-hans"
LANGUAGES = [("zh-hans", "简体中文"), ("en", "English")]
LOCALE_PATHS = [BASE_DIR / "locale"]
LANGUAGE_COOKIE_SAMESITE = "Lax"
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
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "request": {
            "format": "%(asctime)s %(levelname)s %(name)s [request %(request_id)s] %(message)s"
        },
    },
    "filters": {
        "redact": {"()": "aero.redact.RedactingFilter"},
        "request_id": {"()": "aero.errors.RequestIdFilter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "plain",
            "filters": ["redact"],
        },
        "requests": {
            "class": "logging.StreamHandler",
            "formatter": "request",
            "filters": ["request_id", "redact"],
        },
    },
    "loggers": {
        # Every 5xx with its traceback and the request's id (Django's own handlers for
        # this logger print only with DEBUG).
        "django.request": {"handlers": ["requests"], "level": "ERROR"},
        "aero": {"handlers": ["console"], "level": env_str("AERO_LOG_LEVEL", "INFO")},
        "diagnosis": {"handlers": ["console"], "level": env_str("AERO_LOG_LEVEL", "INFO")},
        "approvals": {"handlers": ["console"], "level": env_str("AERO_LOG_LEVEL", "INFO")},
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
# The largest alert delivery /ingest/ reads (bytes). Above the rest of the site's
# DATA_UPLOAD_MAX_MEMORY_SIZE: a full Alertmanager group (up to 1,000 alerts, values up
# to 4,000 characters) must fit; a larger one gets a JSON 413 naming this limit.
AERO_INGEST_MAX_BYTES = env_int("AERO_INGEST_MAX_BYTES", 16 * 1024 * 1024, minimum=1024)
# Observations (every alert and the gate's decision) are kept this many days, then
# pruned by the workers' maintenance loop; the sessions they opened keep their alerts.
AERO_OBSERVATION_RETENTION_DAYS = env_int("AERO_OBSERVATION_RETENTION_DAYS", 30, minimum=1)
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
