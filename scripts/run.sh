#!/usr/bin/env bash
# Start AERO at http://127.0.0.1:8000: migrate, load the built-in data, create the demo
# users, then serve. With DATABASE_URL + REDIS_URL set it runs on PostgreSQL + Redis:
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
# at once overflowed it (ADR 81).
BACKLOG=${AERO_LISTEN_BACKLOG:-1024}

if [ -n "${DATABASE_URL:-}" ]; then
  if [ -z "${DATABASE_OWNER_URL:-}" ]; then
    echo "DATABASE_URL is set but DATABASE_OWNER_URL is not: the app must not own its tables." >&2
    echo "Set DATABASE_OWNER_URL to the owner (e.g. postgres://postgres@127.0.0.1:5432/aero) and" >&2
    echo "DATABASE_URL to the app's role (e.g. postgres://aero_app:PASSWORD@127.0.0.1:5432/aero)." >&2
    exit 2
  fi
  DATABASE_URL="$DATABASE_OWNER_URL" $PY manage.py migrate --noinput -v0
  DATABASE_URL="$DATABASE_OWNER_URL" $PY manage.py db_roles --app-url "$DATABASE_URL"
else
  $PY manage.py migrate --noinput -v0
fi
$PY manage.py load_builtin
$PY manage.py seed_demo
$PY manage.py collectstatic --noinput -v0

# Prometheus multi-process files describe processes of this run only: start empty.
METRICS_DIR=${PROMETHEUS_MULTIPROC_DIR:-${AERO_DATA_DIR:-var}/metrics}
mkdir -p "$METRICS_DIR" && rm -f "$METRICS_DIR"/*.db

pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT INT TERM

if [ -n "${REDIS_URL:-}" ]; then
  for _ in $(seq "${AERO_WORKERS:-1}"); do
    $PY manage.py aero_worker &
    pids+=($!)
  done
  echo "Mode: PostgreSQL + Redis, ${AERO_WORKERS:-1} worker(s) (more: .venv/bin/python manage.py aero_worker)"
  export AERO_WS_URL=${AERO_WS_URL:-ws://$HOST:$WS_PORT}
  .venv/bin/daphne -e "tcp:port=$WS_PORT:interface=$HOST:backlog=$BACKLOG" aero.asgi:application &
  pids+=($!)
  .venv/bin/gunicorn aero.wsgi:application --bind "$HOST:$PORT" --backlog "$BACKLOG" \
    --worker-class gthread --workers "${AERO_WEB_WORKERS:-3}" --threads "${AERO_WEB_THREADS:-4}" \
    --access-logfile - &
  pids+=($!)
  echo "AERO is at http://$HOST:$PORT/ (WebSockets: $AERO_WS_URL)"
else
  echo "Mode: embedded (SQLite in var/, in-process worker, offline LLM provider)"
  .venv/bin/daphne -e "tcp:port=$PORT:interface=$HOST:backlog=$BACKLOG" aero.asgi:application &
  pids+=($!)
  echo "AERO is at http://$HOST:$PORT/"
fi
wait -n "${pids[@]}"
