#!/usr/bin/env bash
# Start AERO at http://127.0.0.1:8000: migrate, load the built-in data, create the demo
# users, then serve. With DATABASE_URL + REDIS_URL set it runs on PostgreSQL + Redis and
# starts AERO_WORKERS django-rq workers (default 1) next to the web server.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
HOST=${AERO_HOST:-127.0.0.1}
PORT=${AERO_PORT:-8000}

$PY manage.py migrate --noinput -v0
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
else
  echo "Mode: embedded (SQLite in var/, in-process worker, offline LLM provider)"
fi
echo "AERO is at http://$HOST:$PORT/"
.venv/bin/daphne -b "$HOST" -p "$PORT" aero.asgi:application &
pids+=($!)
wait -n "${pids[@]}"
