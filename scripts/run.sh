#!/usr/bin/env bash
# Start AERO at http://127.0.0.1:8000: migrate, load the built-in data, create the demo
# users (embedded mode only: production mode never creates them, `manage.py seed_demo`
# still can), then serve. With DATABASE_URL + REDIS_URL set it runs on PostgreSQL + Redis:
# gunicorn serves HTTP (AERO_WEB_WORKERS processes x AERO_WEB_THREADS threads, so views
# run concurrently), daphne serves the WebSockets on AERO_WS_PORT (default port + 1),
# and AERO_WORKERS django-rq workers (default 1) run the jobs. Embedded mode runs
# everything in one daphne process (in-memory channel layer, in-process job worker).
# On PostgreSQL, DATABASE_OWNER_URL is the role that owns the tables (migrations run as
# it) and DATABASE_URL the app's own role, created here if missing, which may only read
# and append to the audit and event logs (manage.py db_roles).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
HOST=${AERO_HOST:-127.0.0.1}
PORT=${AERO_PORT:-8000}
WS_PORT=${AERO_WS_PORT:-$((PORT + 1))}
# Twisted listens with a backlog of 50 by default: 100 browsers opening their sockets
# at once overflowed it.
BACKLOG=${AERO_LISTEN_BACKLOG:-1024}
# daphne refuses a WebSocket still opening after 5 s by default: a thousand viewers'
# pages reconnecting at once (a restart) are answered together, later than that on a
# loaded host, so all were refused, reconnected, and were refused again.
WS_CONNECT_TIMEOUT=${AERO_WS_CONNECT_TIMEOUT:-60}

# The compiled translations (not committed): `make run` builds them, and so does
# this script run on its own, or the interface (Chinese by default) comes up in English.
for po in locale/*/LC_MESSAGES/django.po; do
  mo=${po%.po}.mo
  if [ ! "$mo" -nt "$po" ]; then
    command -v msgfmt >/dev/null 2>&1 || scripts/install-system-deps.sh
    msgfmt --check-format -o "$mo" "$po"
  fi
done

# A set-up step whose inputs are unchanged since it last succeeded is skipped
# (scripts/setup_stamps.py: stamps in the data dir), so a restart with nothing changed
# starts no Django process before the servers; the steps that do run share one Django
# process. AERO_SETUP_ALWAYS=1 runs every step.
steps() { $PY scripts/setup_stamps.py run "$@"; }
SEEDED=${AERO_DATA_DIR:-var}/stamps/seed_demo.out

if [ -n "${DATABASE_URL:-}" ]; then
  if [ -z "${DATABASE_OWNER_URL:-}" ]; then
    echo "DATABASE_URL is set but DATABASE_OWNER_URL is not: the app must not own its tables." >&2
    echo "Set DATABASE_OWNER_URL to the owner (e.g. postgres://postgres@127.0.0.1:5432/aero) and" >&2
    echo "DATABASE_URL to the app's role (e.g. postgres://aero_app:PASSWORD@127.0.0.1:5432/aero)." >&2
    exit 2
  fi
  DATABASE_URL="$DATABASE_OWNER_URL" steps migrate
  # Served over https (real production): an owner with SUPERUSER is refused, as it could
  # switch the audit triggers off. A plain-http try-out (AERO_HTTPS=0) is only warned.
  # Never skipped: the roles' attributes and grants can change outside AERO.
  owner_check=(--require-unprivileged-owner)
  case "${AERO_HTTPS:-1}" in 0 | false | no | off) owner_check=() ;; esac
  DATABASE_URL="$DATABASE_OWNER_URL" $PY manage.py db_roles --app-url "$DATABASE_URL" "${owner_check[@]}"
  steps load_builtin collectstatic
  echo "Production mode: no demo users are created (create an admin: .venv/bin/python manage.py createsuperuser)"
else
  # The demo users' table is printed again when the step is skipped: without it, run it.
  [ -s "$SEEDED" ] || rm -f "${AERO_DATA_DIR:-var}/stamps/seed_demo"
  steps migrate load_builtin seed_demo collectstatic
  cat "$SEEDED"
fi

# Prometheus multi-process files describe processes of this run only: start empty.
METRICS_DIR=${PROMETHEUS_MULTIPROC_DIR:-${AERO_DATA_DIR:-var}/metrics}
mkdir -p "$METRICS_DIR" && rm -f "$METRICS_DIR"/*.db

if [ "${1:-}" = "--setup-only" ]; then
  echo "Set up: not starting the servers (--setup-only)"
  exit 0
fi

# supervisord runs every process (docs/operations.md): one that exits is restarted (at
# once after a run, with a growing backoff while it keeps failing to start) and each exit
# is logged. A web server that cannot start at all stops the run (supervisor_listener.py).
# Ctrl-C or SIGTERM stops every process, then the chains' heads are anchored.
RUN_DIR=${AERO_DATA_DIR:-var}/supervisor
mkdir -p "$RUN_DIR" && rm -f "$RUN_DIR/fatal"
CONF="$RUN_DIR/supervisord.conf"
program() { # program NAME COMMAND [NUMPROCS [STARTSECS STARTRETRIES]]
  cat <<CONF
[program:$1]
command=$2
directory=$PWD
numprocs=${3:-1}
process_name=%(program_name)s$([ "${3:-1}" -gt 1 ] || [ "$1" = worker ] && echo "-%(process_num)d")
numprocs_start=1
autorestart=true
startsecs=${4:-2}
startretries=${5:-1000000}
stopsignal=TERM
stopwaitsecs=60
stopasgroup=true
killasgroup=true
redirect_stderr=true
stdout_logfile=/dev/stdout
stdout_logfile_maxbytes=0
environment=AERO_DB_APPLICATION_NAME="aero-$1$([ "${3:-1}" -gt 1 ] || [ "$1" = worker ] && echo "-%(process_num)d")"

CONF
}
{
  cat <<CONF
[supervisord]
nodaemon=true
# In the foreground supervisord logs to stdout already: no second copy.
logfile=/dev/null
logfile_maxbytes=0
loglevel=info
pidfile=$RUN_DIR/supervisord.pid

[unix_http_server]
file=$RUN_DIR/supervisor.sock
chmod=0700

[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface

[supervisorctl]
serverurl=unix://$RUN_DIR/supervisor.sock

[eventlistener:fatal]
command=$PY scripts/supervisor_listener.py
directory=$PWD
events=PROCESS_STATE_FATAL
stderr_logfile=/dev/stderr
stderr_logfile_maxbytes=0

CONF
  # A web server gets 3 tries (AERO_WEB_START_RETRIES) to stay up 10 s (gunicorn itself
  # retries its bind for 5 s, as a killed predecessor's children may hold the port a
  # moment): then FATAL.
  WEB_RETRIES=${AERO_WEB_START_RETRIES:-3}
  if [ -n "${REDIS_URL:-}" ]; then
    # Each process's database pool (aero/settings.py): a gunicorn process its threads
    # plus the web ticker's, daphne its database threads plus one, workers 8.
    program worker "$PY manage.py aero_worker" "${AERO_WORKERS:-1}"
    # The model calls sessions wait for: one runner per host, supervised like a
    # worker. AERO_LLM_WAITS=0 makes the calls inside the jobs instead (no runner).
    case "${AERO_LLM_WAITS:-1}" in
      0 | false | no | off) ;;
      *) program llmrunner "$PY manage.py aero_llm_runner" ;;
    esac
    # AERO_WS_PROCESSES daphne processes (2) share one listening socket that supervisord
    # opens (an fcgi-program hands it to each as fd 0): the kernel spreads the browsers'
    # sockets over them, and a live fragment rendered by one is fetched by the others
    # from Redis (diagnosis/live_shared.py), so the push scales past one process's CPU.
    program daphne ".venv/bin/daphne --fd 0 --websocket_connect_timeout $WS_CONNECT_TIMEOUT aero.asgi:application" "${AERO_WS_PROCESSES:-2}" 10 "$WEB_RETRIES" |
      sed "s|^\[program:daphne\]|[fcgi-program:daphne]\nsocket=tcp://$HOST:$WS_PORT\nsocket_backlog=$BACKLOG|"
    program gunicorn ".venv/bin/gunicorn aero.wsgi:application --bind $HOST:$PORT --backlog $BACKLOG --worker-class gthread --workers ${AERO_WEB_WORKERS:-3} --threads ${AERO_WEB_THREADS:-4} --env AERO_DB_POOL_SIZE=${AERO_WEB_DB_POOL_SIZE:-$((${AERO_WEB_THREADS:-4} + 1))} --access-logfile -" 1 10 "$WEB_RETRIES"
  else
    program daphne ".venv/bin/daphne -e tcp:port=$PORT:interface=$HOST:backlog=$BACKLOG --websocket_connect_timeout $WS_CONNECT_TIMEOUT aero.asgi:application" 1 10 "$WEB_RETRIES"
  fi
} >"$CONF"

if [ -n "${REDIS_URL:-}" ]; then
  export AERO_WS_URL=${AERO_WS_URL:-ws://$HOST:$WS_PORT}
  export AERO_SUPERVISED_WEB="daphne gunicorn"
  echo "Mode: PostgreSQL + Redis, ${AERO_WORKERS:-1} worker(s) (more: .venv/bin/python manage.py aero_worker)"
  echo "AERO is at http://$HOST:$PORT/ (WebSockets: $AERO_WS_URL)"
else
  export AERO_SUPERVISED_WEB="daphne"
  echo "Mode: embedded (SQLite in var/, in-process worker, offline LLM provider)"
  echo "AERO is at http://$HOST:$PORT/"
fi
export AERO_SUPERVISOR_FATAL="$RUN_DIR/fatal"
# /healthz asks supervisord which processes are configured and which run (aero/supervision.py).
AERO_SUPERVISOR_SOCKET="$(cd "$RUN_DIR" && pwd)/supervisor.sock"
export AERO_SUPERVISOR_SOCKET

.venv/bin/supervisord -c "$CONF" &
supervisor=$!
stop() { kill -TERM "$supervisor" 2>/dev/null || true; }
trap stop INT TERM
# wait returns early (143) when a trapped signal arrives: wait again until supervisord is
# gone, then take its own exit status (bash keeps a reaped child's for wait), not 143.
while kill -0 "$supervisor" 2>/dev/null; do
  wait "$supervisor" || true
done
status=0
wait "$supervisor" || status=$?
trap - INT TERM
# The chains' heads, anchored outside the database at every stop (aero.anchors).
$PY manage.py anchor_heads >/dev/null 2>&1 || echo "anchoring the chain heads failed" >&2
if [ -s "$RUN_DIR/fatal" ]; then
  exit 1
fi
exit "$status"
