#!/usr/bin/env bash
# Build kube-apiserver v1.20.2 from Debian bookworm's `kubernetes` source package and cache it.
#
# Why: the tests marked `kube` need a real API server, and no registry we may use ships one.
# Debian's source package is the full upstream v1.20.2 tree; Debian builds only kubectl from it,
# but kube-apiserver builds from the same tree with Debian's Go 1.19 and runs on Debian's etcd.
#
# Contract:
#   - stdout gets exactly one line, the path of the cached binary; progress goes to stderr.
#   - A cached binary that runs (`--version`) with etcd installed: print its path and exit at once.
#   - Otherwise install the missing Debian packages (root, or sudo), fetch the source, build in a
#     temporary work dir, install the binary atomically, and delete the work dir (Go's build cache
#     is about 1.4 GB) unless KEEP_BUILD=1.
#   - Cache: ${GPUTOPO_CACHE_DIR:-$HOME/.cache/gputopo}/kube-apiserver-v1.20.2/kube-apiserver,
#     the same rule tests/harness/kube.py uses to find it.
#   - On failure: the last lines of the build log and the log's path.
set -euo pipefail

readonly KUBE_VERSION=v1.20.2
readonly CACHE_DIR="${GPUTOPO_CACHE_DIR:-${HOME}/.cache/gputopo}"
readonly INSTALL_DIR="${CACHE_DIR}/kube-apiserver-${KUBE_VERSION}"
readonly BINARY="${INSTALL_DIR}/kube-apiserver"
readonly LOG_FILE="${CACHE_DIR}/build-kube-apiserver.log"
readonly DEBIAN_MIRROR="${GPUTOPO_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
readonly SRC_LIST=/etc/apt/sources.list.d/gputopo-bookworm-src.sources
readonly GO=/usr/bin/go
# The build needs Go, dpkg-source and the fixed reflect2/json-iterator; the tests need etcd.
readonly BUILD_PACKAGES=(
  golang-go
  etcd-server
  dpkg-dev
  golang-github-modern-go-reflect2-dev
  golang-github-json-iterator-go-dev
)
readonly RUNTIME_PACKAGES=(etcd-server)
# Go packages the generated openapi file must not cover (upstream's Makefile.generated_files).
readonly OPENAPI_EXCLUDE='^vendor/k8s.io/(code-generator|sample-apiserver)/'

WORK_DIR=""
SOURCE_VERSION=""
STEP="starting"
STARTED_AT=${SECONDS}

say() { printf '[kube-apiserver] %s\n' "$*" >&2; }

# A progress line that also names the step a failure report will blame.
step() {
  STEP="$1"
  say "$1..."
}

die() {
  say "error: $*"
  exit 1
}

# Run a command with its output going only to the build log.
logged() {
  printf '\n$ %s\n' "$*" >>"${LOG_FILE}"
  "$@" >>"${LOG_FILE}" 2>&1
}

as_root() {
  if [[ ${EUID} -eq 0 ]]; then
    "$@"
  elif command -v sudo >/dev/null; then
    sudo "$@"
  else
    die "need root (or sudo) to run: $*"
  fi
}

binary_works() {
  [[ -x ${BINARY} ]] && "${BINARY}" --version 2>/dev/null | grep -qF "Kubernetes ${KUBE_VERSION}"
}

etcd_path() {
  command -v etcd 2>/dev/null || true
}

is_installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

install_missing() {
  local missing=() pkg
  for pkg in "$@"; do
    is_installed "${pkg}" || missing+=("${pkg}")
  done
  ((${#missing[@]} == 0)) && return 0
  step "installing Debian packages: ${missing[*]}"
  logged as_root apt-get update -q
  logged as_root env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q --no-install-recommends "${missing[@]}"
}

check_debian_bookworm() {
  local codename
  codename=$(sed -n 's/^VERSION_CODENAME=//p' /etc/os-release 2>/dev/null || true)
  [[ ${codename} == bookworm ]] || die "this build needs Debian 12 (bookworm), found '${codename:-unknown}'.
  Elsewhere, point GPUTOPO_KUBE_APISERVER at a kube-apiserver ${KUBE_VERSION} binary instead."
}

has_kubernetes_source() {
  apt-cache showsrc kubernetes 2>/dev/null | grep -q '^Package: kubernetes$'
}

# Add a bookworm deb-src entry in a file of our own, but only when no source index is usable.
ensure_source_index() {
  has_kubernetes_source && return 0
  if [[ ! -e ${SRC_LIST} ]]; then
    say "adding a bookworm deb-src entry in ${SRC_LIST}"
    as_root tee "${SRC_LIST}" >/dev/null <<EOF
Types: deb-src
URIs: ${DEBIAN_MIRROR}
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  fi
  logged as_root apt-get update -q
  has_kubernetes_source || die "apt-get knows no source package 'kubernetes' even after update"
}

# Fetch and unpack the source into $GOPATH/src/k8s.io/kubernetes; GOPATH mode needs that path
# because the tree's go.mod and vendor/modules.txt disagree under module mode.
fetch_source() {
  local download="${WORK_DIR}/download" tree
  step "fetching source (apt-get source kubernetes, about 35 MB)"
  mkdir -p "${download}" "${GOPATH}/src/k8s.io"
  (cd "${download}" && logged apt-get source -q kubernetes)
  tree=$(find "${download}" -mindepth 1 -maxdepth 1 -type d -name 'kubernetes-*')
  SOURCE_VERSION=$(cd "${download}" && ls kubernetes_*.dsc)
  SOURCE_VERSION=${SOURCE_VERSION#kubernetes_}
  SOURCE_VERSION=${SOURCE_VERSION%.dsc}
  [[ ${tree} == *really1.20.2 || ${tree} == */kubernetes-1.20.2 ]] ||
    die "Debian's kubernetes source is '${tree##*/}', not upstream ${KUBE_VERSION}"
  mv "${tree}" "${GOPATH}/src/k8s.io/kubernetes"
}

# Vendored reflect2 1.0.1 faults on Go >= 1.18 at the first custom-resource write; Debian's
# reflect2 1.0.2 and json-iterator 1.1.12 fix it.
replace_broken_vendor() {
  local dep
  for dep in github.com/modern-go/reflect2 github.com/json-iterator/go; do
    [[ -d /usr/share/gocode/src/${dep} ]] || die "missing /usr/share/gocode/src/${dep}"
    rm -rf "vendor/${dep}"
    cp -rL "/usr/share/gocode/src/${dep}" "vendor/${dep}"
  done
}

# The directories upstream's Makefile.generated_files feeds to openapi-gen for
# pkg/generated/openapi: every dir with Go files (staging named as vendor/...), whose files
# carry a `+k8s:openapi-gen=` tag, minus code-generator and sample-apiserver.
openapi_input_dirs() (
  # grep exits 1 on a batch with no match; that is not an error here.
  set +o pipefail
  local dirs
  dirs=$(find -H . \( -path './_*' -o -path './.*' -o -path ./vendor \) -prune -o \
    -type f -name '*.go' -print |
    sed -e 's|^\./staging/src|vendor|' -e 's|/[^/]*$||' -e 's|^\./||' | LC_ALL=C sort -u)
  # shellcheck disable=SC2086 # word splitting of the directory list is intended
  find ${dirs} -maxdepth 1 -type f -name '*.go' -print0 |
    xargs -0 -r grep -l '^// *+k8s:' | grep -Ev "${OPENAPI_EXCLUDE}" |
    xargs -r grep -l '+k8s:openapi-gen=' | xargs -r -n1 dirname | LC_ALL=C sort -u
)

# pkg/generated/openapi/zz_generated.openapi.go is not in the tarball; generate it as upstream
# does, or the build fails with `undefined: openapi.GetOpenAPIDefinitions`.
generate_openapi() {
  local inputs
  step "generating pkg/generated/openapi (openapi-gen)"
  logged "${GO}" build -o "${WORK_DIR}/bin/openapi-gen" ./vendor/k8s.io/kube-openapi/cmd/openapi-gen
  inputs=$(openapi_input_dirs | sed 's|^|k8s.io/kubernetes/|' | paste -sd, -)
  [[ -n ${inputs} ]] || die "found no packages tagged for openapi-gen"
  logged "${WORK_DIR}/bin/openapi-gen" --logtostderr \
    -i "${inputs}" \
    -p k8s.io/kubernetes/pkg/generated/openapi \
    -O zz_generated.openapi \
    -h vendor/k8s.io/code-generator/hack/boilerplate.go.txt \
    -r "${WORK_DIR}/openapi-violations.report"
  [[ -s pkg/generated/openapi/zz_generated.openapi.go ]] || die "openapi-gen wrote nothing"
}

version_ldflags() {
  local pkg key value flags="-s -w"
  local -A values=(
    [gitVersion]="${KUBE_VERSION}"
    [gitMajor]=1
    [gitMinor]=20
    [gitTreeState]=archive
    [buildDate]="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  )
  for pkg in client-go/pkg/version component-base/version; do
    for key in "${!values[@]}"; do
      value=${values[${key}]}
      flags+=" -X k8s.io/kubernetes/vendor/k8s.io/${pkg}.${key}=${value}"
    done
  done
  printf '%s' "${flags}"
}

build_binary() {
  step "building (about 4 minutes on 2 cores, 1.5 GB of RAM and 2 GB of disk)"
  logged "${GO}" build -ldflags "$(version_ldflags)" -o "${WORK_DIR}/bin/kube-apiserver" \
    ./cmd/kube-apiserver
  "${WORK_DIR}/bin/kube-apiserver" --version | grep -qF "Kubernetes ${KUBE_VERSION}" ||
    die "the built binary does not report ${KUBE_VERSION}"
}

# Copy next to the target, then rename: a reader never sees half a binary.
install_binary() {
  local tmp="${INSTALL_DIR}/.kube-apiserver.tmp.$$"
  mkdir -p "${INSTALL_DIR}"
  cp "${WORK_DIR}/bin/kube-apiserver" "${tmp}"
  chmod 0755 "${tmp}"
  mv -f "${tmp}" "${BINARY}"
  write_build_info
}

# Record what went into the binary, and where etcd was, for whoever debugs a test run later.
write_build_info() {
  {
    printf 'kube_version=%s\n' "${KUBE_VERSION}"
    printf 'debian_source=%s\n' "${SOURCE_VERSION}"
    printf 'go=%s\n' "$("${GO}" version)"
    printf 'built=%s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    printf 'etcd=%s\n' "$(etcd_path)"
  } >"${INSTALL_DIR}/build-info"
}

on_exit() {
  local status=$?
  if ((status != 0)) && [[ -s ${LOG_FILE} ]]; then
    say "FAILED while ${STEP%% (*} after $((SECONDS - STARTED_AT)) s; last lines of the log:"
    tail -n 30 "${LOG_FILE}" | sed 's/^/    /' >&2
    say "full log: ${LOG_FILE}"
  fi
  if [[ -n ${WORK_DIR} && -d ${WORK_DIR} ]]; then
    if [[ ${KEEP_BUILD:-0} == 1 ]]; then
      say "kept the work dir (KEEP_BUILD=1): ${WORK_DIR}"
    else
      chmod -R u+w "${WORK_DIR}" 2>/dev/null || true
      rm -rf "${WORK_DIR}"
    fi
  fi
}

report_etcd() {
  local etcd
  etcd=$(etcd_path)
  [[ -n ${etcd} ]] || die "etcd is not on PATH; install Debian's etcd-server"
  say "etcd: ${etcd} ($("${etcd}" --version 2>/dev/null | head -n1))"
}

build() {
  check_debian_bookworm
  install_missing "${BUILD_PACKAGES[@]}"
  ensure_source_index
  WORK_DIR=$(mktemp -d "${TMPDIR:-/tmp}/gputopo-kube-apiserver.XXXXXX")
  export GOPATH="${WORK_DIR}/gopath" GOCACHE="${WORK_DIR}/gocache"
  export GO111MODULE=off GOPROXY=off GOFLAGS="" CGO_ENABLED=0
  fetch_source
  cd "${GOPATH}/src/k8s.io/kubernetes"
  replace_broken_vendor
  generate_openapi
  build_binary
  install_binary
  say "built in $((SECONDS - STARTED_AT)) s"
}

main() {
  if binary_works && [[ -n $(etcd_path) ]]; then
    say "cached: ${BINARY} (etcd: $(etcd_path))"
    printf '%s\n' "${BINARY}"
    return 0
  fi
  mkdir -p "${CACHE_DIR}"
  # One build at a time per cache; a waiting run then finds the binary the first one built.
  exec 9>"${CACHE_DIR}/.build-kube-apiserver.lock"
  if ! flock -n 9; then
    say "another build into ${CACHE_DIR} is running; waiting for it..."
    flock 9
  fi
  trap on_exit EXIT
  : >"${LOG_FILE}"
  if binary_works; then
    install_missing "${RUNTIME_PACKAGES[@]}"
  else
    build
  fi
  report_etcd
  say "binary: ${BINARY}"
  printf '%s\n' "${BINARY}"
}

main "$@"
