#!/usr/bin/env bash
# Build the gputopo OCI image without a container daemon or a registry (`make image`).
#
# Why: the manifests name ghcr.io/gputopo/gputopo:VERSION, and a user (or this project's CI)
# must be able to build exactly that image on a machine with nothing but Debian's archive and
# PyPI. The Dockerfile does the same for those with a registry and a daemon.
#
# How (every tool from Debian's archive, installed once when missing):
#   1. mmdebstrap: a minimal Debian bookworm root filesystem with python3 (3.11, the project's);
#   2. pip (this checkout's .venv): a wheel of this checkout and of its runtime dependencies,
#      installed into /opt/gputopo inside that root filesystem, offline;
#   3. a non-root user 65532 (`gputopo`); aggregator and scheduler run as it, the exporter's
#      DaemonSet runs it privileged as the manifests say;
#   4. umoci: an OCI image layout tagged VERSION, entrypoint `gputopo`, user 65532.
# Reproducible where the tools allow: SOURCE_DATE_EPOCH is the last commit's time (mmdebstrap
# and the layer's file times use it), files are normalised before packing. What still varies
# between builds: the Debian archive's state on the day (package versions), and pip's .pyc
# files and RECORD lines of installed wheels (removed: __pycache__ is not shipped).
#
# Output (cached, keyed by a hash of the tracked source, this script and the Debian suite):
#   ~/.cache/gputopo/image/KEY/oci      the OCI layout (`skopeo copy oci:...:VERSION docker://...`)
#   ~/.cache/gputopo/image/KEY/rootfs   the unpacked root filesystem (the test runs it with chroot)
#   ~/.cache/gputopo/image/current      a symlink to the latest KEY (the two newest are kept)
# A second run with the same inputs prints the path and exits at once. Progress on stderr.
set -euo pipefail

say() { printf '[image] %s\n' "$*" >&2; }

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SUITE=bookworm
MIRROR=${GPUTOPO_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# Debian's security fixes and stable updates too, as the Dockerfile's apt-get gets them.
SECURITY_MIRROR=${GPUTOPO_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
CACHE=${GPUTOPO_IMAGE_CACHE:-${HOME}/.cache/gputopo/image}
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' "${ROOT}/pyproject.toml" | head -1)
PY=${ROOT}/.venv/bin/python

source "${ROOT}/scripts/apt-lib.sh"
APT_TAG=image
for tool in mmdebstrap umoci; do
  command -v "${tool}" >/dev/null 2>&1 || apt_install image "${tool}"
done
[[ -x ${PY} ]] || { say "no .venv: run make setup first"; exit 1; }

cd "${ROOT}"
# The inputs: every file git tracks (or would, untracked but not ignored), as they are now.
key=$( {
  git ls-files -co --exclude-standard -z | LC_ALL=C sort -z | xargs -0 sha256sum
  echo "${SUITE} ${MIRROR} ${SECURITY_MIRROR} ${VERSION}"
} | sha256sum | cut -c1-16)
out=${CACHE}/${key}
if [[ -f ${out}/done ]]; then
  ln -sfn "${out}" "${CACHE}/current"
  echo "${out}"
  exit 0
fi
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
work=$(mktemp -d "${CACHE}.tmp.XXXXXX" 2>/dev/null || { mkdir -p "${CACHE}"; mktemp -d "${CACHE}/tmp.XXXXXX"; })
# mmdebstrap mounts /proc, /sys and /dev inside the root filesystem while it works; a failure
# can leave one mounted. Unmount whatever is below the work directory before deleting it, and
# never let rm cross into another file system.
clean_work() {
  local m
  for m in $(awk -v w="$1" 'index($2, w) == 1 {print $2}' /proc/mounts | sort -r); do
    umount -l "${m}" 2>/dev/null || true
  done
  rm -rf --one-file-system "$1"
}
trap 'clean_work "${work}"' EXIT
rootfs=${work}/rootfs

say "1/4 Debian ${SUITE} root filesystem (mmdebstrap)"
# A mirror hiccup (apt-get update failing once) is retried rather than failing the build.
for attempt in 1 2 3; do
  if mmdebstrap --quiet --mode=root --variant=minbase \
    --include=python3,python3-venv,ca-certificates \
    "${SUITE}" "${rootfs}" \
    "deb ${MIRROR} ${SUITE} main" \
    "deb ${MIRROR} ${SUITE}-updates main" \
    "deb ${SECURITY_MIRROR} ${SUITE}-security main" >&2; then
    break
  fi
  [[ ${attempt} -eq 3 ]] && { say "mmdebstrap failed 3 times: is ${MIRROR} reachable?"; exit 1; }
  say "mmdebstrap failed (attempt ${attempt}); retrying in 5 s"
  clean_work "${rootfs}"
  sleep 5
done

say "2/4 wheels of this checkout and its runtime dependencies"
# From a copy of exactly the files the cache key hashed: building in the checkout would leave a
# build/ directory there, whose stale copies of deleted modules a later wheel would ship.
mkdir -p "${work}/src"
git ls-files -co --exclude-standard -z | tar --null -T - -cf - | tar -xf - -C "${work}/src"
# With the `cuda` extra: cuda-bindings, so the exporter's GPU copy probes can run wherever the
# NVIDIA runtime gives the container a driver (without one they say why, never crash).
"${PY}" -m pip wheel --quiet --disable-pip-version-check -w "${work}/wheels" "${work}/src[cuda]" >&2
mkdir -p "${rootfs}/tmp/wheels"
cp "${work}"/wheels/*.whl "${rootfs}/tmp/wheels/"
# env -i: nothing of this machine's environment (pip settings, proxies) reaches the image.
in_root() { chroot "${rootfs}" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/root "$@"; }
in_root /usr/bin/python3 -m venv /opt/gputopo
in_root /opt/gputopo/bin/pip install --quiet --no-index --no-compile \
  --disable-pip-version-check --find-links /tmp/wheels 'gputopo[cuda]' >&2
rm -rf "${rootfs}/tmp/wheels"
find "${rootfs}/opt/gputopo" -name __pycache__ -type d -prune -exec rm -rf {} +
ln -sf /opt/gputopo/bin/gputopo "${rootfs}/usr/local/bin/gputopo"

say "3/4 the non-root user 65532"
echo 'gputopo:x:65532:65532:gputopo:/nonexistent:/usr/sbin/nologin' >>"${rootfs}/etc/passwd"
echo 'gputopo:x:65532:' >>"${rootfs}/etc/group"
rm -rf "${rootfs}"/var/cache/apt/* "${rootfs}"/var/lib/apt/lists/* "${rootfs}"/var/log/*
find "${rootfs}" -newermt "@${SOURCE_DATE_EPOCH}" -print0 2>/dev/null \
  | xargs -0r touch --no-dereference --date="@${SOURCE_DATE_EPOCH}"

say "4/4 OCI image ghcr.io/gputopo/gputopo:${VERSION} (umoci)"
umoci init --layout "${work}/oci"
umoci new --image "${work}/oci:${VERSION}"
umoci unpack --image "${work}/oci:${VERSION}" "${work}/bundle" >&2
rm -rf "${work}/bundle/rootfs"
mv "${rootfs}" "${work}/bundle/rootfs"
created=$(date -u -d "@${SOURCE_DATE_EPOCH}" +%Y-%m-%dT%H:%M:%SZ)
umoci repack --image "${work}/oci:${VERSION}" --history.created "${created}" \
  --history.created_by "scripts/build-image.sh" "${work}/bundle"
umoci config --image "${work}/oci:${VERSION}" --created "${created}" \
  --history.created "${created}" --history.created_by "scripts/build-image.sh" \
  --config.user 65532:65532 --config.entrypoint /opt/gputopo/bin/gputopo \
  --config.cmd --help --config.workingdir / \
  --config.env PATH=/opt/gputopo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --config.label "org.opencontainers.image.version=${VERSION}" \
  --config.label "org.opencontainers.image.source=https://github.com/gputopo/gputopo"
umoci gc --layout "${work}/oci"

mkdir -p "${out}"
mv "${work}/oci" "${out}/oci"
mv "${work}/bundle/rootfs" "${out}/rootfs"
touch "${out}/done"
ln -sfn "${out}" "${CACHE}/current"
# Keep the two newest finished images (this one and the one before); older ones go. Only
# finished KEY directories of this cache are candidates, and none with anything mounted in it.
# (The `current` symlink is not a candidate: it would count the newest image twice.)
hex16=$(printf '[0-9a-f]%.0s' {1..16})
# shellcheck disable=SC2086 # the glob is meant to expand
for old in $(ls -1dt "${CACHE}"/${hex16}/done 2>/dev/null | tail -n +3); do
  dir=$(dirname "${old}")
  [[ $(basename "${dir}") =~ ^[0-9a-f]{16}$ ]] || continue
  awk -v d="${dir}/" 'index($2 "/", d) == 1 {found=1} END {exit !found}' /proc/mounts && continue
  say "removing an older image: ${dir}"
  rm -rf --one-file-system "${dir}"
done
say "done: ${out}/oci (tag ${VERSION}), root filesystem ${out}/rootfs"
echo "${out}"
