#!/usr/bin/env bash
# Print the path of a Python >= 3.12 on this machine (PATH first, then pyenv), or fail.
set -u
ok() { "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' >/dev/null 2>&1; }
for candidate in python3.12 python3.13 python3 python; do
  path=$(command -v "$candidate" 2>/dev/null) || continue
  if ok "$path"; then echo "$path"; exit 0; fi
done
root=${PYENV_ROOT:-$HOME/.pyenv}
for dir in $(ls -d "$root"/versions/3.1[2-9]* 2>/dev/null | sort -V); do
  if ok "$dir/bin/python3"; then echo "$dir/bin/python3"; exit 0; fi
done
# pyenv shims need PYENV_VERSION to pick a non-default version.
if command -v pyenv >/dev/null 2>&1; then
  for version in $(pyenv versions --bare 2>/dev/null | grep -E '^3\.1[2-9]' | sort -V); do
    path=$(PYENV_VERSION=$version pyenv which python3 2>/dev/null) || continue
    if ok "$path"; then echo "$path"; exit 0; fi
  done
fi
echo "find-python: no Python >= 3.12 found (install one, or set PYTHON=/path/to/python3.12)" >&2
exit 1
