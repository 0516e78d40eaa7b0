#!/usr/bin/env bash
# The browser tests drive Debian's Chromium (never a downloaded build): install it when it
# is missing. Silent when it is there.
set -euo pipefail
. "$(dirname "$0")/lib/apt.sh"
command -v chromium >/dev/null 2>&1 && exit 0
apt_install "browser tests" chromium
