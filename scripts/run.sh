#!/usr/bin/env bash
# Start AERO at http://127.0.0.1:8000: migrate, load the built-in data, create the demo
# users, then serve. With DATABASE_URL + REDIS_URL set it runs on PostgreSQL + Redis and
# starts AERO_WORKERS django-rq workers (default 1) next to the web server.
# On PostgreSQL, DATABASE_OWNER_URL is the role that owns the tables (migrations run as
# it) and DATABASE_URL the app's own role, created here if missing, which may only read
# and append to the audit and event logs (manage.py db_roles).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
HOST=${AERO_HOST:-127.0.0.1}
PORT=${AERO_PORT:-8000}

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

pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT INT TERM

if [ -n "${REDIS_URL:-}" ]; then
  for _ in $(seq "${AERO_WORKERS:-1}"); do
    $PY manage.py aero_worker &
    pids+=($!)
  done
  echo "Mode: PostgreSQL + Redis, ${AERO_WORKERS:-1} worker(s) (more: .venv/bin/python manage.py aero_worker)"
else
  echo "Mode: embedded (SQLite in var/, in-process worker, offline LLM provider)"
fi
echo "AERO is at http://$HOST:$PORT/"
.venv/bin/daphne -b "$HOST" -p "$PORT" aero.asgi:application &
pids+=($!)
wait -n "${pids[@]}"
