#!/usr/bin/env bash
# Make sure Debian's chromium is installed for the tests marked `browser`.
#
# Why: the aggregator's topology page (/ui/) is built by JavaScript, so it is tested in a real
# headless browser (tests/ui/), and Debian ships one (package `chromium`).
# Contract: `chromium` already on PATH: exit 0 at once, print nothing; else install it
# (scripts/apt-lib.sh: root or sudo, apt), or exit 1 saying what to install.
set -euo pipefail
command -v chromium >/dev/null 2>&1 && exit 0
source "$(dirname "$0")/apt-lib.sh"
apt_install chromium chromium
say "installed $(chromium --version 2>&1 | tail -1)"
