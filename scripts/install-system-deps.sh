#!/usr/bin/env bash
# System packages the tests drive for real: Debian's Prometheus Alertmanager (+ amtool) for
# the alerts-in test, and CJK fonts (fonts-noto-cjk) so the browser tests' screenshots of
# Chinese pages are readable instead of boxes. Idempotent: nothing happens when they are
# installed. Installs only when allowed (root, apt-get present); otherwise says how.
set -euo pipefail
packages=()
if ! command -v prometheus-alertmanager >/dev/null 2>&1 || ! command -v amtool >/dev/null 2>&1; then
  packages+=(prometheus-alertmanager)
fi
if ! fc-list 2>/dev/null | grep -qi "Noto Sans CJK"; then
  packages+=(fonts-noto-cjk)
fi
if [ "${#packages[@]}" -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "Installing Debian ${packages[*]} for the tests..."
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${packages[@]}" >/dev/null
  # Alertmanager starts nothing here (no systemd), and the tests run their own instance.
else
  echo "missing: ${packages[*]}: run 'sudo apt-get install -y ${packages[*]}'" >&2
  exit 1
fi
