#!/usr/bin/env bash
# Make sure a real Prometheus is installed for the tests marked `prometheus`.
#
# Why: the aggregator's metrics are checked by a real Prometheus scraping them
# (tests/aggregator/test_http.py, tests/exporter/), and Debian ships one (package `prometheus`).
#
# Contract:
#   - `prometheus` already on PATH (or /usr/bin/prometheus): exit 0 at once, print nothing.
#   - Otherwise install Debian's package (root, or sudo), without starting its service: the
#     tests start their own Prometheus on a free port. Progress goes to stderr.
#   - Not Debian/apt, or no root: say what to install and exit 1 (the tests then fail, loudly).
set -euo pipefail

say() { printf '[prometheus] %s\n' "$*" >&2; }

if command -v prometheus >/dev/null 2>&1 || [[ -x /usr/bin/prometheus ]]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  say "prometheus is not installed and this is not a Debian/apt system: install Prometheus 2.x"
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
say "installing Debian's prometheus package (once)..."
# policy-rc.d exit 101 keeps the package's service from starting during the install.
policy=/usr/sbin/policy-rc.d
created_policy=0
if [[ ! -e ${policy} ]]; then
  printf '#!/bin/sh\nexit 101\n' | as_root tee "${policy}" >/dev/null
  as_root chmod +x "${policy}"
  created_policy=1
fi
trap '[[ ${created_policy} -eq 1 ]] && as_root rm -f "${policy}"' EXIT
as_root apt-get update -q >&2
as_root env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -q --no-install-recommends prometheus >&2
say "installed $(prometheus --version 2>&1 | head -1)"
