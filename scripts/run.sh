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

# The compiled translations (not committed): `make run` builds them, and so does
# this script run on its own, or the interface (Chinese by default) comes up in English.
for po in locale/*/LC_MESSAGES/django.po; do
  mo=${po%.po}.mo
  if [ ! "$mo" -nt "$po" ]; then
    command -v msgfmt >/dev/null 2>&1 || scripts/install-system-deps.sh
    msgfmt --check-format -o "$mo" "$po"
  fi
done

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
if [ -z "${DATABASE_URL:-}" ]; then
  $PY manage.py seed_demo
else
  echo "Production mode: no demo users are created (create an admin: .venv/bin/python manage.py createsuperuser)"
fi
$PY manage.py collectstatic --noinput -v0

# Prometheus multi-process files describe processes of this run only: start empty.
METRICS_DIR=${PROMETHEUS_MULTIPROC_DIR:-${AERO_DATA_DIR:-var}/metrics}
mkdir -p "$METRICS_DIR" && rm -f "$METRICS_DIR"/*.db

# A small supervisor: every process runs under it; one that exits is restarted
# with a backoff (1 s, doubling to 30 s, back to 1 s after a minute up), so a crashed
# worker never takes the web server down. A web server that exits within 10 s of its
# first start (a port in use, a bad setting) stops the whole script: that is no crash
# a restart would cure. Ctrl-C or SIGTERM stops every process.
declare -A proc_pid=() proc_started=() proc_delay=() proc_web=() proc_tries=()
start_worker() { exec $PY manage.py aero_worker; }
start_llmrunner() { exec $PY manage.py aero_llm_runner; }
start_daphne() {
  if [ -n "${REDIS_URL:-}" ]; then
    exec .venv/bin/daphne -e "tcp:port=$WS_PORT:interface=$HOST:backlog=$BACKLOG" aero.asgi:application
  fi
  exec .venv/bin/daphne -e "tcp:port=$PORT:interface=$HOST:backlog=$BACKLOG" aero.asgi:application
}
start_gunicorn() {
  exec .venv/bin/gunicorn aero.wsgi:application --bind "$HOST:$PORT" --backlog "$BACKLOG" \
    --worker-class gthread --workers "${AERO_WEB_WORKERS:-3}" --threads "${AERO_WEB_THREADS:-4}" \
    --access-logfile -
}
launch() { # launch NAME: run start_<NAME without its -N suffix> in the background
  local name=$1
  "start_${name%%-*}" &
  proc_pid[$name]=$!
  proc_started[$name]=$SECONDS
  proc_tries[$name]=$((${proc_tries[$name]:-0} + 1))
}
cleanup() {
  trap - EXIT INT TERM
  for pid in "${proc_pid[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  # The chains' heads, anchored outside the database at every stop (aero.anchors).
  $PY manage.py anchor_heads >/dev/null 2>&1 || echo "anchoring the chain heads failed" >&2
}
trap cleanup EXIT
trap 'exit 0' INT TERM

if [ -n "${REDIS_URL:-}" ]; then
  for n in $(seq "${AERO_WORKERS:-1}"); do
    launch "worker-$n"
  done
  echo "Mode: PostgreSQL + Redis, ${AERO_WORKERS:-1} worker(s) (more: .venv/bin/python manage.py aero_worker)"
  # The model calls sessions wait for: one runner per host, supervised like a
  # worker. AERO_LLM_WAITS=0 makes the calls inside the jobs instead (no runner).
  case "${AERO_LLM_WAITS:-1}" in
    0 | false | no | off) ;;
    *) launch llmrunner ;;
  esac
  export AERO_WS_URL=${AERO_WS_URL:-ws://$HOST:$WS_PORT}
  proc_web[daphne]=1 proc_web[gunicorn]=1
  launch daphne
  launch gunicorn
  echo "AERO is at http://$HOST:$PORT/ (WebSockets: $AERO_WS_URL)"
else
  echo "Mode: embedded (SQLite in var/, in-process worker, offline LLM provider)"
  proc_web[daphne]=1
  launch daphne
  echo "AERO is at http://$HOST:$PORT/"
fi

while true; do
  done_pid="" status=0
  wait -n -p done_pid "${proc_pid[@]}" || status=$?
  [ -n "$done_pid" ] || continue # woken by a signal, not by an exit
  for name in "${!proc_pid[@]}"; do
    [ "${proc_pid[$name]}" = "$done_pid" ] || continue
    up=$((SECONDS - proc_started[$name]))
    if [ -n "${proc_web[$name]:-}" ] && [ "${proc_tries[$name]}" = 1 ] && [ "$up" -lt 10 ]; then
      echo "$name could not start (exit status $status): stopping AERO" >&2
      exit 1
    fi
    delay=${proc_delay[$name]:-1}
    if [ "$up" -ge 60 ]; then delay=1; fi
    echo "$name (pid $done_pid) exited with status $status after ${up} s: restarting it in ${delay} s" >&2
    sleep "$delay"
    proc_delay[$name]=$((delay * 2 > 30 ? 30 : delay * 2))
    launch "$name"
  done
done
