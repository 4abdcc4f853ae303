# Shared by the scripts that install a Debian package the tests need (sourced, not run):
# `as_root CMD...` runs CMD as root (directly, or with sudo), and `apt_install TAG PACKAGE`
# installs PACKAGE without recommends, progress on stderr prefixed with [TAG]. Either exits 1
# with a one-line reason when it cannot (no apt, no root): the tests then fail, loudly.

say() { printf '[%s] %s\n' "${APT_TAG:-setup}" "$*" >&2; }

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

apt_install() {
  APT_TAG=$1
  local package=$2
  if ! command -v apt-get >/dev/null 2>&1; then
    say "${package} is not installed and this is not a Debian/apt system: install it"
    exit 1
  fi
  say "installing Debian's ${package} package (once)..."
  as_root apt-get update -q >&2
  as_root env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q --no-install-recommends "${package}" >&2
}
