#!/usr/bin/env bash
# Prints the interpreter of the repository's Python virtual environment, .venv/ (git-ignored;
# DCP_MLA_VENV names another folder), making it first if needed. The scripts install with pip
# into it, never into the system Python, which Debian 12 and Ubuntu 24.04 mark externally
# managed (PEP 668: `pip install` there fails with "externally-managed-environment"). It sees the
# system's site-packages (torch, where installed), and has its own pip.
#
# Where `python3 -m venv` fails (Debian and Ubuntu ship venv and ensurepip in the separate
# python3-venv package), it installs python3-venv with apt-get, as root or through sudo, once.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv="${DCP_MLA_VENV:-$root/.venv}"
py="$venv/bin/python"
if [ -x "$py" ] && "$py" -m pip --version >/dev/null 2>&1; then
  echo "$py"
  exit 0
fi
make_venv() {
  rm -rf "$venv"
  python3 -m venv --system-site-packages "$venv" >/dev/null 2>&1
}
if ! make_venv; then
  rm -rf "$venv"
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "python-venv: \`python3 -m venv\` failed and there is no apt-get: install your distribution's venv package" >&2
    exit 1
  fi
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "python-venv: \`python3 -m venv\` failed; installing python3-venv with apt-get" >&2
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
  if ! make_venv; then
    rm -rf "$venv"
    python3 -m venv --system-site-packages "$venv" >&2  # once more, with its message
  fi
fi
echo "$py"
