#!/usr/bin/env bash
# System packages the tests drive for real: Debian's Prometheus Alertmanager (+ amtool) for
# the alerts-in test. Idempotent: nothing happens when they are installed. Installs only
# when allowed (root, apt-get present); otherwise says how.
set -euo pipefail
if command -v prometheus-alertmanager >/dev/null 2>&1 && command -v amtool >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "Installing Debian prometheus-alertmanager for the alerts-in tests..."
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus-alertmanager >/dev/null
  # The package starts nothing here (no systemd), and the tests run their own instance.
else
  echo "prometheus-alertmanager is not installed: run 'sudo apt-get install -y prometheus-alertmanager'" >&2
  exit 1
fi
