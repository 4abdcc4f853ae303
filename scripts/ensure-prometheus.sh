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

if command -v prometheus >/dev/null 2>&1 || [[ -x /usr/bin/prometheus ]]; then
  exit 0
fi
source "$(dirname "$0")/apt-lib.sh"
APT_TAG=prometheus
# policy-rc.d exit 101 keeps the package's service from starting during the install.
policy=/usr/sbin/policy-rc.d
created_policy=0
if [[ ! -e ${policy} ]]; then
  printf '#!/bin/sh\nexit 101\n' | as_root tee "${policy}" >/dev/null
  as_root chmod +x "${policy}"
  created_policy=1
fi
trap '[[ ${created_policy} -eq 1 ]] && as_root rm -f "${policy}"' EXIT
apt_install prometheus prometheus
say "installed $(prometheus --version 2>&1 | head -1)"
