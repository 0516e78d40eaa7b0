#!/usr/bin/env bash
# System packages the project needs: GNU gettext's msgfmt (compiles the translations at
# `make install`), Debian's Prometheus Alertmanager (+ amtool) for the alerts-in test,
# Debian's Prometheus (+ promtool) for the metrics-source test (the IT diagnosis pack reads
# metrics through /api/v1/query_range), bubblewrap (bwrap) to run uploaded skills with no
# network and a read-only view of their files, and CJK fonts so browser screenshots of Chinese pages show characters, not boxes.
# Idempotent and silent when everything is there; installs as root or through
# passwordless sudo, otherwise says what to run.
set -euo pipefail
. "$(dirname "$0")/lib/apt.sh"
missing=()
command -v msgfmt >/dev/null 2>&1 || missing+=(gettext)
if ! command -v prometheus-alertmanager >/dev/null 2>&1 || ! command -v amtool >/dev/null 2>&1; then
  missing+=(prometheus-alertmanager)
fi
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
  missing+=(prometheus)
fi
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
# Read the list first: `fc-list | grep -q` under pipefail fails when grep stops early.
fonts=$(fc-list : family 2>/dev/null || true)
if ! grep -qi "Noto Sans CJK" <<<"$fonts"; then
  missing+=(fonts-noto-cjk)
fi
[ ${#missing[@]} -eq 0 ] && exit 0
apt_install "translations, alerts test, metrics-source test, skill sandbox, CJK fonts" "${missing[@]}"
