#!/usr/bin/env bash
# Start AERO at http://127.0.0.1:8000: migrate, load the built-in data, create the demo
# users (embedded mode only), then serve. With DATABASE_URL + REDIS_URL set it runs on
# PostgreSQL + Redis and starts AERO_WORKERS django-rq workers (default 1) next to the web
# server; production mode never creates demo users (`manage.py seed_demo` still can).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
HOST=${AERO_HOST:-127.0.0.1}
PORT=${AERO_PORT:-8000}

$PY manage.py migrate --noinput -v0
$PY manage.py load_builtin
if [ -z "${DATABASE_URL:-}" ]; then
  $PY manage.py seed_demo
else
  echo "Production mode: no demo users are created (create an admin: .venv/bin/python manage.py createsuperuser)"
fi
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
