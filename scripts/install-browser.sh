#!/usr/bin/env bash
# The browser tests drive Debian's Chromium (never a downloaded build). Install it when
# it is missing and we are allowed to (root, apt-get present); otherwise say how.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then exit 0; fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "Installing Debian chromium for the browser tests..."
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
else
  echo "chromium is not installed: run 'sudo apt-get install -y chromium' for the browser tests" >&2
  exit 1
fi
