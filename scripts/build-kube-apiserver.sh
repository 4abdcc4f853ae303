#!/usr/bin/env bash
# Build kube-apiserver v1.20.2 (and kube-scheduler, from the same tree) from Debian's
# `kubernetes` source package and cache them.
#
# Why: the tests marked `kube` need a real API server, and no registry we may use ships one.
# Debian's source package (bookworm, pinned by hash below) is the full upstream v1.20.2 tree;
# Debian builds only kubectl from it, but kube-apiserver builds from the same tree with Go and runs
# on etcd. Nothing in the build is Debian-specific: the source is two tarballs fetched over HTTP
# and the toolchain is whatever Go is on PATH, so it runs on any Linux where Go and etcd can be
# installed. On apt systems (Debian, Ubuntu) it installs what is missing itself.
#
# Contract:
#   - stdout gets exactly one line, the path of the kube-apiserver to use; progress goes to stderr.
#   - GPUTOPO_KUBE_APISERVER set: check that it runs and reports v1.20.2, and that etcd is there;
#     print it and build nothing (the test harness reads the same variable).
#   - A cached binary that runs (`--version`) with etcd installed: print its path and exit at once.
#   - `--check`: say which Go, etcd and tools the build would use, or what is missing; build
#     nothing (exit 1 when something is missing).
#   - Otherwise install what is missing (apt systems, root or sudo; elsewhere it says what to
#     install), fetch and verify the source, build in a temporary work dir, install the binary
#     atomically, and delete the work dir (Go's build cache is about 1.4 GB) unless KEEP_BUILD=1.
#   - Cache: ${GPUTOPO_CACHE_DIR:-$HOME/.cache/gputopo}/kube-apiserver-v1.20.2/kube-apiserver,
#     the same rule tests/harness/kube.py uses to find it.
#   - On failure: the last lines of the build log and the log's path.
#
# Tested end to end on Debian 12 (Go 1.19, etcd 3.4). Go 1.19 to 1.22 should build the tree
# unchanged; from Go 1.23 the linker's //go:linkname check is turned off for this old tree.
set -euo pipefail

readonly KUBE_VERSION=v1.20.2
readonly CACHE_DIR="${GPUTOPO_CACHE_DIR:-${HOME}/.cache/gputopo}"
readonly INSTALL_DIR="${CACHE_DIR}/kube-apiserver-${KUBE_VERSION}"
readonly BINARY="${INSTALL_DIR}/kube-apiserver"
# Built from the same tree beside it: the tests that run a real kube-scheduler next to gputopo.
readonly SCHEDULER="${INSTALL_DIR}/kube-scheduler"
readonly LOG_FILE="${CACHE_DIR}/build-kube-apiserver.log"
readonly DEBIAN_MIRROR="${GPUTOPO_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# Debian bookworm's source package of upstream v1.20.2: the upstream tarball and Debian's
# patches, with the SHA-256 sums its signed .dsc lists.
readonly SOURCE_VERSION=1.20.5+really1.20.2-1.1+deb12u1
readonly SOURCE_POOL="${DEBIAN_MIRROR}/pool/main/k/kubernetes"
readonly SOURCE_FILES=(
  "b83c0780efb182d928dc63d46488a847f161f04e40a94b96bf5247dd671ecdfc kubernetes_1.20.5+really1.20.2.orig.tar.gz"
  "9b6e5fd41769d2b5badf2e73b274e3bcd90f85e13d06a1a4a845ccce018127d8 kubernetes_1.20.5+really1.20.2-1.1+deb12u1.debian.tar.xz"
)
readonly GO_MIN_MINOR=19
# The reflect2/json-iterator versions that work on Go >= 1.18 (see replace_broken_vendor).
readonly FIXED_VENDOR=(
  "github.com/modern-go/reflect2 v1.0.2 golang-github-modern-go-reflect2-dev"
  "github.com/json-iterator/go v1.1.12 golang-github-json-iterator-go-dev"
)
# Go packages the generated openapi file must not cover (upstream's Makefile.generated_files).
readonly OPENAPI_EXCLUDE='^vendor/k8s.io/(code-generator|sample-apiserver)/'

WORK_DIR=""
GO=""
GO_MINOR=0
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
  local binary
  for binary in "${BINARY}" "${SCHEDULER}"; do
    [[ -x ${binary} ]] && "${binary}" --version 2>/dev/null | grep -qF "Kubernetes ${KUBE_VERSION}" ||
      return 1
  done
}

# etcd as the test harness finds it: $GPUTOPO_ETCD, else `etcd` on PATH, else /usr/bin/etcd.
etcd_path() {
  local candidate
  if [[ -n ${GPUTOPO_ETCD:-} ]]; then
    [[ -f ${GPUTOPO_ETCD} && -x ${GPUTOPO_ETCD} ]] && printf '%s\n' "${GPUTOPO_ETCD}"
    return 0
  fi
  candidate=$(command -v etcd 2>/dev/null || true)
  [[ -z ${candidate} && -x /usr/bin/etcd ]] && candidate=/usr/bin/etcd
  [[ -n ${candidate} ]] && printf '%s\n' "${candidate}"
  return 0
}

has_apt() {
  command -v apt-get >/dev/null 2>&1
}

# Go as the build uses it: $GPUTOPO_GO, else `go` on PATH. Sets GO and GO_MINOR; GO stays empty
# when there is none.
find_go() {
  local candidate version
  GO=""
  GO_MINOR=0
  candidate=${GPUTOPO_GO:-$(command -v go 2>/dev/null || true)}
  [[ -n ${candidate} && -x ${candidate} ]] || return 0
  version=$("${candidate}" version 2>/dev/null || true)
  [[ ${version} =~ go1\.([0-9]+) ]] || return 0
  GO=${candidate}
  GO_MINOR=${BASH_REMATCH[1]}
}

# What is missing for a build, one line each (empty: nothing is).
missing_requirements() {
  local tool
  find_go
  if [[ -z ${GO} ]]; then
    echo "Go >= 1.${GO_MIN_MINOR} (not found: set GPUTOPO_GO or put go on PATH; https://go.dev/dl)"
  elif ((GO_MINOR < GO_MIN_MINOR)); then
    echo "Go >= 1.${GO_MIN_MINOR} (${GO} is go1.${GO_MINOR}; set GPUTOPO_GO to a newer one)"
  fi
  [[ -n $(etcd_path) ]] || echo "etcd >= 3.4 (not found: set GPUTOPO_ETCD or put etcd on PATH)"
  for tool in curl tar gzip xz patch sha256sum flock; do
    command -v "${tool}" >/dev/null 2>&1 || echo "${tool}"
  done
}

# The Debian/Ubuntu packages that provide what `missing_requirements` lists.
apt_packages_for() {
  local line
  while IFS= read -r line; do
    case ${line} in
      Go*) echo golang-go ;;
      etcd*) echo etcd-server ;;
      xz) echo xz-utils ;;
      sha256sum) echo coreutils ;;
      flock) echo util-linux ;;
      *) echo "${line}" ;;
    esac
  done
}

# Install what is missing where apt can; elsewhere name it and stop.
ensure_requirements() {
  local missing packages
  [[ $(uname -s) == Linux ]] || die "kube-apiserver and etcd run on Linux only, this is $(uname -s).
  Point GPUTOPO_KUBE_APISERVER at a kube-apiserver ${KUBE_VERSION} binary (and GPUTOPO_ETCD at etcd) instead."
  missing=$(missing_requirements)
  if [[ -n ${missing} ]] && has_apt; then
    packages=$(apt_packages_for <<<"${missing}" | sort -u | paste -sd' ' -)
    step "installing packages: ${packages}"
    logged as_root apt-get update -q
    # shellcheck disable=SC2086 # one word per package
    logged as_root env DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -q --no-install-recommends ${packages}
    missing=$(missing_requirements)
  fi
  [[ -z ${missing} ]] || die "the build needs:
$(sed 's/^/    - /' <<<"${missing}")
  Install them, or point GPUTOPO_KUBE_APISERVER at a kube-apiserver ${KUBE_VERSION} binary."
}

# A cached binary needs only etcd: install it where apt can, else say how to give it.
ensure_etcd() {
  [[ -n $(etcd_path) ]] && return 0
  if has_apt; then
    step "installing packages: etcd-server"
    logged as_root apt-get update -q
    logged as_root env DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -q --no-install-recommends etcd-server
  fi
  [[ -n $(etcd_path) ]] || die "etcd not found; install etcd >= 3.4 or set GPUTOPO_ETCD"
}

# --check: what a build would use, or what it lacks.
check_only() {
  local missing
  missing=$(missing_requirements)
  find_go
  if [[ -n ${GO} ]]; then
    say "go: ${GO} (go1.${GO_MINOR})"
  fi
  [[ -n $(etcd_path) ]] && say "etcd: $(etcd_path)"
  say "source: Debian's kubernetes ${SOURCE_VERSION} from ${SOURCE_POOL}"
  if [[ -z ${missing} ]]; then
    say "ready to build ${KUBE_VERSION} into ${BINARY}"
    return 0
  fi
  say "missing:"
  sed 's/^/    - /' <<<"${missing}" >&2
  if has_apt; then
    say "(apt-get is present: a build installs them)"
    return 0
  fi
  return 1
}

# Fetch the pinned tarballs, check their hashes, unpack upstream's tree and apply Debian's
# patches in series order into $GOPATH/src/k8s.io/kubernetes; GOPATH mode needs that path
# because the tree's go.mod and vendor/modules.txt disagree under module mode.
fetch_source() {
  local download="${WORK_DIR}/download" entry sum name tree patch
  step "fetching source (Debian's kubernetes ${SOURCE_VERSION}, about 35 MB)"
  mkdir -p "${download}" "${GOPATH}/src/k8s.io"
  for entry in "${SOURCE_FILES[@]}"; do
    sum=${entry%% *}
    name=${entry#* }
    logged curl -fsSL --retry 3 -o "${download}/${name}" "${SOURCE_POOL}/${name}"
    printf '%s  %s\n' "${sum}" "${download}/${name}" | sha256sum -c --status ||
      die "${name} from ${SOURCE_POOL} does not have the SHA-256 its Debian .dsc lists"
  done
  tar -xzf "${download}/${SOURCE_FILES[0]#* }" -C "${download}"
  tree="${download}/kubernetes-${KUBE_VERSION#v}"
  [[ -d ${tree} ]] || die "the upstream tarball has no kubernetes-${KUBE_VERSION#v}/"
  tar -xJf "${download}/${SOURCE_FILES[1]#* }" -C "${tree}"
  while IFS= read -r patch; do
    [[ -z ${patch} || ${patch} == \#* ]] && continue
    logged patch -d "${tree}" -p1 --batch --forward -i "debian/patches/${patch}"
  done <"${tree}/debian/patches/series"
  mv "${tree}" "${GOPATH}/src/k8s.io/kubernetes"
}

# Vendored reflect2 1.0.1 faults on Go >= 1.18 at the first custom-resource write; reflect2 1.0.2
# and json-iterator 1.1.12 fix it. Debian's packages of them (installed with apt where it is
# present), else the same versions from the Go module proxy.
replace_broken_vendor() {
  local entry dep version dir
  for entry in "${FIXED_VENDOR[@]}"; do
    read -r dep version package <<<"${entry}"
    dir="/usr/share/gocode/src/${dep}"
    # Debian's package first: the Go module proxy is often out of reach where apt is not.
    if [[ ! -d ${dir} ]] && has_apt; then
      step "installing packages: ${package}"
      logged as_root env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -q --no-install-recommends "${package}" ||
        { logged as_root apt-get update -q &&
          logged as_root env DEBIAN_FRONTEND=noninteractive \
            apt-get install -y -q --no-install-recommends "${package}"; } || true
    fi
    if [[ ! -d ${dir} ]]; then
      dir=$(GO111MODULE=on GOFLAGS=-modcacherw GOPROXY="${GPUTOPO_GOPROXY:-https://proxy.golang.org}" \
        "${GO}" mod download -json "${dep}@${version}" 2>>"${LOG_FILE}" |
        sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
      [[ -d ${dir} ]] || die "could not get ${dep}@${version} (Debian's package or the Go module proxy)"
    fi
    rm -rf "vendor/${dep}"
    cp -rL "${dir}" "vendor/${dep}"
    chmod -R u+w "vendor/${dep}"
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
  # Go 1.23 refuses //go:linkname pulls into the runtime that this 2021 tree's vendor makes.
  ((GO_MINOR >= 23)) && flags+=" -checklinkname=0"
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
  step "building kube-apiserver and kube-scheduler (about 6 minutes on 2 cores, 1.5 GB of RAM)"
  local name
  for name in kube-apiserver kube-scheduler; do
    logged "${GO}" build -ldflags "$(version_ldflags)" -o "${WORK_DIR}/bin/${name}" "./cmd/${name}"
    "${WORK_DIR}/bin/${name}" --version | grep -qF "Kubernetes ${KUBE_VERSION}" ||
      die "the built ${name} does not report ${KUBE_VERSION}"
  done
}

# Copy next to the target, then rename: a reader never sees half a binary.
install_binary() {
  local name tmp
  mkdir -p "${INSTALL_DIR}"
  for name in kube-scheduler kube-apiserver; do  # the API server last: binary_works checks it
    tmp="${INSTALL_DIR}/.${name}.tmp.$$"
    cp "${WORK_DIR}/bin/${name}" "${tmp}"
    chmod 0755 "${tmp}"
    mv -f "${tmp}" "${INSTALL_DIR}/${name}"
  done
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
  [[ -n ${etcd} ]] || die "etcd not found; install etcd >= 3.4 or set GPUTOPO_ETCD"
  say "etcd: ${etcd} ($("${etcd}" --version 2>/dev/null | head -n1))"
}

build() {
  ensure_requirements
  find_go
  say "go: ${GO} (go1.${GO_MINOR})"
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

# GPUTOPO_KUBE_APISERVER names the binary to test with: check it, build nothing.
use_given_binary() {
  local given=${GPUTOPO_KUBE_APISERVER} version etcd
  [[ -f ${given} && -x ${given} ]] || die "GPUTOPO_KUBE_APISERVER=${given} is not an executable file;
  unset it to build ${KUBE_VERSION} here, or point it at a kube-apiserver ${KUBE_VERSION} binary"
  version=$("${given}" --version 2>/dev/null | head -n1 || true)
  [[ ${version} == "Kubernetes ${KUBE_VERSION}" ]] ||
    die "GPUTOPO_KUBE_APISERVER=${given} reports '${version:-no version}'; the tests need ${KUBE_VERSION}"
  etcd=$(etcd_path)
  [[ -n ${etcd} ]] || die "GPUTOPO_KUBE_APISERVER is set, but etcd was not found: install etcd >= 3.4
  or set GPUTOPO_ETCD to its path"
  say "GPUTOPO_KUBE_APISERVER is set: using ${given}, building nothing (etcd: ${etcd})"
  printf '%s\n' "${given}"
}

main() {
  if [[ ${1:-} == --check ]]; then
    check_only
    return
  fi
  if [[ -n ${GPUTOPO_KUBE_APISERVER:-} ]]; then
    use_given_binary
    return
  fi
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
    ensure_etcd
  else
    build
  fi
  report_etcd
  say "binary: ${BINARY}"
  printf '%s\n' "${BINARY}"
}

main "$@"
