# Shared by the install scripts: install Debian packages as root (or through sudo without
# a password), waiting for another apt/dpkg run to release its lock instead of failing.
# Usage: apt_install WHAT-FOR PACKAGE...
apt_install() {
  local why=$1; shift
  local sudo=()
  if [ "$(id -u)" != "0" ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      sudo=(sudo -n)
    else
      echo "missing system packages ($why): run 'sudo apt-get install -y $*'" >&2
      return 1
    fi
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "missing system packages ($why): install $* with your system's package manager" >&2
    return 1
  fi
  echo "Installing Debian $* ($why); waiting up to 5 min for a held apt lock..."
  # DPkg::Lock::Timeout makes apt wait for a lock held by another apt or dpkg run.
  local apt=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 -qq)
  "${apt[@]}" update
  "${apt[@]}" install -y "$@" >/dev/null
}
