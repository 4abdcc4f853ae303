#!/usr/bin/env bash
# Make sure Debian's chromium is installed for the tests marked `browser`.
#
# Why: the aggregator's topology page (/ui/) is built by JavaScript, so it is tested in a real
# headless browser (tests/ui/), and Debian ships one (package `chromium`).
#
# Contract: `chromium` already on PATH: exit 0 at once, print nothing. Otherwise install the
# package (root, or sudo), progress on stderr. Not Debian/apt, or no root: say what to install
# and exit 1 (the tests then fail, loudly).
set -euo pipefail

say() { printf '[chromium] %s\n' "$*" >&2; }

if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  say "chromium is not installed and this is not a Debian/apt system: install Chromium"
  exit 1
fi
as_root() {
  if [[ ${EUID} -eq 0 ]]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    say "need root (or sudo) to run: $*"
    exit 1
  fi
}
say "installing Debian's chromium package (once)..."
as_root apt-get update -q >&2
as_root env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -q --no-install-recommends chromium >&2
say "installed $(chromium --version 2>&1 | tail -1)"
