# Shared by the install scripts: install Debian packages as root, or through sudo (without
# a password, or asking for it on a terminal), waiting for another apt/dpkg run to release
# its locks instead of failing. Usage: apt_install WHAT-FOR PACKAGE...
# APT_LOCK_WAIT: how many seconds to keep retrying a held lock (default 120).

_apt_sudo=()

# apt-get quietly; retried while another apt or dpkg run holds a lock. DPkg::Lock::Timeout
# covers dpkg's lock only: apt 2.6 fails at once on `update`'s lists lock.
_apt_get() {
  local waited=0 limit=${APT_LOCK_WAIT:-120} out rc
  while :; do
    rc=0
    out=$("${_apt_sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
      apt-get -o DPkg::Lock::Timeout="$limit" -qq "$@" 2>&1 </dev/null) || rc=$?
    [ "$rc" -eq 0 ] && return 0
    if grep -qE "Could not get lock|Unable to lock|Unable to acquire" <<<"$out" && [ "$waited" -lt "$limit" ]; then
      [ "$waited" -eq 0 ] && echo "  another apt/dpkg run holds a lock: retrying for up to ${limit} s..."
      sleep 5
      waited=$((waited + 5))
      continue
    fi
    printf '%s\n' "$out" >&2
    return "$rc"
  done
}

apt_install() {
  local why=$1
  shift
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "missing system packages ($why): install $* with your system's package manager" >&2
    return 1
  fi
  _apt_sudo=()
  if [ "$(id -u)" != "0" ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      _apt_sudo=(sudo -n)
    elif command -v sudo >/dev/null 2>&1 && [ -t 0 ]; then
      echo "Installing $* ($why) needs root: sudo asks for your password."
      sudo -v || {
        echo "sudo refused: run 'sudo apt-get install -y $*' yourself, then try again" >&2
        return 1
      }
      _apt_sudo=(sudo)
    else
      echo "missing system packages ($why): $*" >&2
      echo "  not root, and no sudo that works here (none, or it needs a password off a terminal): as root run 'apt-get install -y $*', then try again" >&2
      return 1
    fi
  fi
  echo "Installing Debian packages $* ($why)"
  echo "  apt-get update"
  _apt_get update
  echo "  apt-get install $* (waiting up to ${APT_LOCK_WAIT:-120} s for a held lock)"
  _apt_get install -y "$@"
  echo "  installed $*"
}
