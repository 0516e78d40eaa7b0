#!/usr/bin/env bash
# System packages the project needs: GNU gettext's msgfmt (compiles the translations,
# locale/*/django.po, at `make install`), Debian's Prometheus Alertmanager (+ amtool) for
# the alerts-in test, and CJK fonts (fonts-noto-cjk) so the browser tests' screenshots of
# Chinese pages are readable instead of boxes. Idempotent: nothing happens when they are
# installed. Installs only when allowed (root, apt-get present); otherwise says how.
set -euo pipefail
missing=()
command -v msgfmt >/dev/null 2>&1 || missing+=(gettext)
if ! command -v prometheus-alertmanager >/dev/null 2>&1 || ! command -v amtool >/dev/null 2>&1; then
  missing+=(prometheus-alertmanager)
fi
if ! fc-list 2>/dev/null | grep -qi "Noto Sans CJK"; then
  missing+=(fonts-noto-cjk)
fi
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "Installing Debian ${missing[*]}..."
  # Another apt run (a helper, unattended-upgrades) may hold the dpkg lock: wait for it
  # rather than fail the first time.
  apt-get -o DPkg::Lock::Timeout=300 update -qq
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
    "${missing[@]}" >/dev/null
  # Alertmanager starts nothing here (no systemd), and the tests run their own instance.
else
  echo "missing system packages: run 'sudo apt-get install -y ${missing[*]}'" >&2
  exit 1
fi
