#!/usr/bin/env bash
# Start, stop or inspect a real Kubernetes API server (etcd + kube-apiserver,
# no kubelet, no controllers) on this one host, for hpctrain's tests and for
# development; with HPCTRAIN_K8S_NODES=1 also a real node (containerd, a
# kubelet, kube-scheduler, kube-controller-manager, a CNI bridge and local
# images: scripts/k8s/node.sh), so that pods run in containers.
#
#   scripts/local-k8s.sh up      install (if needed), build (if needed) and start it
#   scripts/local-k8s.sh down    stop it, remove its state and its kubeconfig context
#   scripts/local-k8s.sh status  print what runs; exit 0 only if it is up and ready
#   scripts/local-k8s.sh build   only build and cache kube-apiserver, kubelet, kube-scheduler,
#                                kube-controller-manager and the pause program (up builds what it needs)
#
# Needs root (up/down) on Debian 12. kube-apiserver 1.20 is built from Debian's
# `kubernetes` source package (fetched through a temporary deb-src list; the
# system's apt configuration is left alone) with Debian's Go, once: the binary is
# cached outside the checkout, so later runs start in seconds. etcd is Debian's.
# Both listen on 127.0.0.1 only, on free ports. Authentication is a bearer
# token, authorization RBAC; the token's user is in system:masters.
#
# `up` writes a standalone kubeconfig ($STATE/kubeconfig) and merges it into the
# default kubeconfig (~/.kube/config, or the first file of $KUBECONFIG) as the
# context `hpctrain-local`, made current; other contexts are kept. It installs
# the Kubeflow CRDs vendored in src/hpctrain/schedulers/kubernetes/crds/:
# PyTorchJob (kubeflow.org/v1) as shipped, and the Trainer v2 CRDs with what
# this old server rejects stripped (scripts/k8s/strip_crds.py), plus the
# torch-distributed ClusterTrainingRuntime. kubectl is not needed.
#
# Environment:
#   HPCTRAIN_K8S_DIR        state directory (default /var/lib/hpctrain-k8s)
#   HPCTRAIN_K8S_CACHE      where built binaries are kept (default /var/cache/hpctrain)
#   HPCTRAIN_K8S_APISERVER  use this kube-apiserver binary instead of building one
#   HPCTRAIN_K8S_CONTEXT    kubeconfig context name (default hpctrain-local)
#   HPCTRAIN_K8S_WAIT       seconds to wait for readiness (default 60)
#   HPCTRAIN_K8S_NODES      1 or 2: `up` also starts that many nodes (hpctrain-node-1, -2), the scheduler
#                           and the controller manager (`status` and `down` cover them whenever present)
#   HPCTRAIN_K8S_POD_CIDR   the pods' addresses, a /16 (default 100.64.0.0/16, outside the flagged private ranges)
#   HPCTRAIN_K8S_NO_CRDS    1: install no Kubeflow CRDs (a second server, for tests of a cluster without
#                           Kubeflow; give it its own HPCTRAIN_K8S_DIR, HPCTRAIN_K8S_CONTEXT and KUBECONFIG)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
HELPERS="$HERE/k8s"
CRD_SRC="$ROOT/src/hpctrain/schedulers/kubernetes/crds"
STATE_DIR="${HPCTRAIN_K8S_DIR:-/var/lib/hpctrain-k8s}"
CACHE_DIR="${HPCTRAIN_K8S_CACHE:-/var/cache/hpctrain}"
CONTEXT="${HPCTRAIN_K8S_CONTEXT:-hpctrain-local}"
WAIT_S="${HPCTRAIN_K8S_WAIT:-60}"
NO_CRDS="${HPCTRAIN_K8S_NO_CRDS:-0}"
LOCK_FILE=/run/lock/hpctrain-local-k8s.lock
GO_BIN=/usr/lib/go-1.19/bin
REFLECT2_DEB=/usr/share/gocode/src/github.com/modern-go/reflect2
# Debian's python3 with python3-yaml (installed by `up`): the helpers need PyYAML.
PY=/usr/bin/python3
BUILD_PACKAGES=(golang-1.19-go golang-github-modern-go-reflect2-dev rsync dpkg-dev make gcc libc6-dev)
RUN_PACKAGES=(etcd-server openssl curl python3 python3-yaml)
# The node parts (HPCTRAIN_K8S_NODES=1): containerd + runc + CNI plugins from Debian, the rest built here.
NODES="${HPCTRAIN_K8S_NODES:-0}"
NODE_PACKAGES=(containerd runc containernetworking-plugins iptables iproute2 util-linux)
NODE_COMPONENTS=(kubelet kube-scheduler kube-controller-manager pause)
COMPONENTS=(kube-apiserver "${NODE_COMPONENTS[@]}")
PAUSE_VERSION=3.4

# shellcheck source=scripts/k8s/node.sh
. "$HELPERS/node.sh"

say() { printf 'local-k8s: %s\n' "$*"; }
die() { printf 'local-k8s: error: %s\n' "$*" >&2; exit 1; }

need_root() {
    [ "$(id -u)" -eq 0 ] || die "'$1' must run as root"
}

check_state_dir() {
    case "$STATE_DIR" in
        /?*) ;;
        *) die "HPCTRAIN_K8S_DIR must be an absolute path: $STATE_DIR" ;;
    esac
}

# The kubeconfig that `up` merges into: the first file of $KUBECONFIG, else ~/.kube/config.
default_kubeconfig() {
    local first="${KUBECONFIG:-}"
    first="${first%%:*}"
    if [ -n "$first" ]; then
        printf '%s\n' "$first"
    else
        printf '%s\n' "${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}/.kube/config"
    fi
}

# pid_alive PIDFILE NAME: the pid in PIDFILE is a live process called NAME.
pid_alive() {
    local pidfile=$1 name=$2 pid comm
    [ -f "$pidfile" ] || return 1
    pid=$(tr -dc '0-9' <"$pidfile")
    [ -n "$pid" ] || return 1
    comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 1
    # The kernel keeps 15 characters of a process's name (kube-controller-manager is kube-controller).
    [ "$comm" = "${name:0:15}" ]
}

# stop_pid PIDFILE NAME: SIGTERM, wait up to 10 s, then SIGKILL.
stop_pid() {
    local pidfile=$1 name=$2 pid i
    pid_alive "$pidfile" "$name" || return 0
    pid=$(tr -dc '0-9' <"$pidfile")
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 20; i++)); do
        pid_alive "$pidfile" "$name" || return 0
        sleep 0.5
    done
    kill -KILL "$pid" 2>/dev/null || true
    sleep 0.5
}

print_logs() {
    local f
    for f in "$STATE_DIR/etcd.log" "$STATE_DIR/kube-apiserver.log"; do
        [ -f "$f" ] || continue
        printf -- '--- tail of %s ---\n' "$f" >&2
        tail -n 25 "$f" >&2
    done
}

APT_UPDATED=0
apt_install() {
    local missing=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
    done
    [ "${#missing[@]}" -eq 0 ] && return
    command -v apt-get >/dev/null 2>&1 || die "missing packages ${missing[*]} and there is no apt-get"
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive DEBCONF_NOWARNINGS=yes
    if [ "$APT_UPDATED" -eq 0 ]; then
        apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null
        APT_UPDATED=1
    fi
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# --- building the Kubernetes programs ------------------------------------------------

# Write deb-src entries for the system's own apt sources into DIR: the same
# entries, with their type changed. The system's configuration is not touched.
write_src_sources() {
    local dir=$1 f n=0
    mkdir -p "$dir/sources.list.d"
    : >"$dir/sources.list"
    if [ -f /etc/apt/sources.list ]; then
        sed -n 's/^[[:space:]]*deb[[:space:]]/deb-src /p' /etc/apt/sources.list >>"$dir/sources.list"
    fi
    for f in /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        sed -n 's/^[[:space:]]*deb[[:space:]]/deb-src /p' "$f" >"$dir/sources.list.d/$(basename "$f")"
    done
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        sed 's/^Types:.*/Types: deb-src/' "$f" >"$dir/sources.list.d/$(basename "$f")"
        n=$((n + 1))
    done
    if [ ! -s "$dir/sources.list" ] && [ "$n" -eq 0 ] && [ -z "$(ls -A "$dir/sources.list.d")" ]; then
        die "no apt sources found in /etc/apt/sources.list or /etc/apt/sources.list.d"
    fi
}

# Fetch Debian's kubernetes source package into WORK/src; print its version.
fetch_source() {
    local work=$1 apt_dir="$1/apt" dsc version
    write_src_sources "$apt_dir"
    mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$work/dl"
    local opts=(
        -o "Dir::Etc::SourceList=$apt_dir/sources.list"
        -o "Dir::Etc::SourceParts=$apt_dir/sources.list.d"
        -o "Dir::State::Lists=$apt_dir/lists"
        -o "Dir::Cache=$apt_dir/cache"
        -o APT::Sandbox::User=root
    )
    say "fetching the kubernetes source package (deb-src, temporary list)" >&2
    # A third-party source without deb-src only warns; `source` below says whether it worked.
    apt-get "${opts[@]}" update -qq >&2 || say "warning: 'apt-get update' of the deb-src lists reported errors" >&2
    (cd "$work/dl" && apt-get "${opts[@]}" source --download-only -qq kubernetes >&2) ||
        die "could not download the kubernetes source package (is there a Debian 12 deb-src for your apt sources?)"
    dsc=$(find "$work/dl" -maxdepth 1 -name 'kubernetes_*.dsc' | head -n 1)
    [ -n "$dsc" ] || die "apt-get source left no kubernetes_*.dsc"
    version=$(sed -n 's/^Version: //p' "$dsc" | head -n 1)
    [ -n "$version" ] || die "no Version in $dsc"
    # apt-get has checked the files against the signed Sources index.
    dpkg-source --no-check -x "$dsc" "$work/src" >/dev/null
    printf '%s\n' "$version"
}

# The vendored reflect2 1.0.1 panics under Go >= 1.18: use Debian's 1.0.2.
fix_reflect2() {
    local vendored="$1/vendor/github.com/modern-go/reflect2"
    [ -d "$vendored" ] || die "the source has no $vendored"
    find "$vendored" -maxdepth 1 -type f \( -name '*.go' -o -name '*.s' \) -delete
    find "$REFLECT2_DEB" -maxdepth 1 -type f \( -name '*.go' -o -name '*.s' \) -exec cp {} "$vendored/" \;
}

# cache_file SRC NAME VERSION: install SRC as $CACHE_DIR/NAME-VERSION (atomically).
cache_file() {
    local target="$CACHE_DIR/$2-$3"
    mkdir -p "$CACHE_DIR"
    install -m 0755 "$1" "$target.tmp"
    mv -f "$target.tmp" "$target"
    say "cached $target" >&2
}

# make_components SRC WORK NAME...: build cmd/NAME for each NAME in one make, at the lowest priority.
make_components() {
    local src=$1 work=$2 targets=() name
    shift 2
    for name in "$@"; do targets+=("cmd/$name"); done
    say "building $* (5-20 minutes each on 2 cores; log: $work/build.log)" >&2
    if ! (cd "$src" &&
        PATH="$GO_BIN:$PATH" CGO_ENABLED=0 GOCACHE="$work/gocache" GOFLAGS="" \
            nice -n 19 make WHAT="${targets[*]}" KUBE_BUILD_PLATFORMS=linux/amd64) >"$work/build.log" 2>&1; then
        tail -n 40 "$work/build.log" >&2
        die "building $* failed (see above)"
    fi
}

# The pause program of the pause image, from the source's build/pause (static, as upstream builds it).
make_pause() {
    local src=$1 out=$2
    command -v gcc >/dev/null 2>&1 || die "gcc is missing (packages gcc libc6-dev)"
    gcc -Os -Wall -Werror -static -DVERSION="v$PAUSE_VERSION-hpctrain" -o "$out" "$src/build/pause/linux/pause.c" ||
        die "building the pause program failed"
}

# build_components NAME...: build the named programs (kube-apiserver, kubelet, kube-scheduler,
# kube-controller-manager, pause) that are not cached yet for the packaged version, and cache them.
build_components() {
    local work version name missing=() commands=()
    apt_install "${BUILD_PACKAGES[@]}" >&2
    [ -d "$REFLECT2_DEB" ] || die "$REFLECT2_DEB is missing (package golang-github-modern-go-reflect2-dev)"
    work=$(mktemp -d /var/tmp/hpctrain-k8s-build.XXXXXX)
    # shellcheck disable=SC2064 # expand now
    trap "rm -rf '$work'" EXIT
    version=$(fetch_source "$work")
    for name in "$@"; do
        [ -x "$CACHE_DIR/$name-$version" ] || missing+=("$name")
    done
    for name in "${missing[@]}"; do
        [ "$name" = pause ] || commands+=("$name")
    done
    if [ "${#commands[@]}" -gt 0 ]; then
        fix_reflect2 "$work/src"
        make_components "$work/src" "$work" "${commands[@]}"
    fi
    for name in "${missing[@]}"; do
        if [ "$name" = pause ]; then
            make_pause "$work/src" "$work/pause"
            cache_file "$work/pause" pause "$version"
        else
            cache_file "$work/src/_output/bin/$name" "$name" "$version"
        fi
    done
    rm -rf "$work"
    trap - EXIT
}

# cached_binary NAME: the newest cached build of NAME; fails when there is none.
cached_binary() {
    local cached
    cached=$(find "$CACHE_DIR" -maxdepth 1 -type f -name "$1-[0-9]*" ! -name '*.tmp' 2>/dev/null | sort -V | tail -n 1 || true)
    [ -n "$cached" ] && [ -x "$cached" ] || return 1
    printf '%s\n' "$cached"
}

# build_missing NAME...: build, in one make, those of the named programs that have no cached build (nothing,
# not even the source's download, when all have one).
build_missing() {
    local name missing=()
    for name in "$@"; do cached_binary "$name" >/dev/null || missing+=("$name"); done
    [ "${#missing[@]}" -eq 0 ] || build_components "${missing[@]}"
}

# binary NAME: the cached build of NAME, built first when there is none.
binary() {
    cached_binary "$1" || { build_components "$1" && cached_binary "$1"; } || die "no $1 after building it"
}

# The kube-apiserver to run: $HPCTRAIN_K8S_APISERVER, else the newest cached
# build, else a fresh build.
apiserver_binary() {
    if [ -n "${HPCTRAIN_K8S_APISERVER:-}" ]; then
        [ -x "$HPCTRAIN_K8S_APISERVER" ] || die "HPCTRAIN_K8S_APISERVER is not an executable file: $HPCTRAIN_K8S_APISERVER"
        printf '%s\n' "$HPCTRAIN_K8S_APISERVER"
        return
    fi
    binary kube-apiserver
}

# --- running it -----------------------------------------------------------------

# The vendored objects: CRDs loaded as shipped, CRDs that need stripping, other objects.
CRDS_AS_SHIPPED=(kubeflow.org_pytorchjobs.yaml)
CRDS_STRIPPED=(trainer.kubeflow.org_trainjobs.yaml trainer.kubeflow.org_trainingruntimes.yaml
    trainer.kubeflow.org_clustertrainingruntimes.yaml)
OBJECTS=(torch_distributed.yaml)
CRD_NAMES=(pytorchjobs.kubeflow.org trainjobs.trainer.kubeflow.org trainingruntimes.trainer.kubeflow.org
    clustertrainingruntimes.trainer.kubeflow.org)

kubeapi() { "$PY" "$HELPERS/kubeapi.py" "$@"; }

# Reads $STATE_DIR/ports into ETCD_PORT, PEER_PORT, API_PORT; fails when there is none.
load_ports() {
    [ -r "$STATE_DIR/ports" ] || return 1
    read -r ETCD_PORT PEER_PORT API_PORT <"$STATE_DIR/ports" || return 1
    [ -n "${API_PORT:-}" ]
}

server_url() { printf 'https://127.0.0.1:%s\n' "$API_PORT"; }

apiserver_ready() {
    local out
    out=$(curl -s --max-time 5 --cacert "$STATE_DIR/pki/ca.crt" "$(server_url)/readyz" 2>/dev/null) || return 1
    [ "$out" = ok ]
}

etcd_healthy() {
    curl -s --max-time 5 "http://127.0.0.1:$ETCD_PORT/health" 2>/dev/null | grep -q '"health":"true"'
}

daemons_running() {
    pid_alive "$STATE_DIR/etcd.pid" etcd && pid_alive "$STATE_DIR/kube-apiserver.pid" kube-apiserver
}

stop_daemons() {
    stop_pid "$STATE_DIR/kube-apiserver.pid" kube-apiserver
    stop_pid "$STATE_DIR/etcd.pid" etcd
}

# wait_for WHAT COMMAND...: poll COMMAND every 0.5 s for $WAIT_S seconds.
wait_for() {
    local what=$1 deadline=$((SECONDS + WAIT_S))
    shift
    until "$@"; do
        if ((SECONDS >= deadline)); then
            print_logs
            die "$what not ready after $WAIT_S s"
        fi
        sleep 0.5
    done
}

# A CA, a serving certificate for 127.0.0.1 signed by it, the service-account key pair and the token.
make_credentials() {
    local pki="$STATE_DIR/pki"
    mkdir -p "$pki"
    chmod 0700 "$STATE_DIR" "$pki"
    openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 3650 -subj /CN=hpctrain-local-ca \
        -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
        -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -sha256 -subj /CN=kube-apiserver \
        -keyout "$pki/server.key" -out "$pki/server.csr" 2>/dev/null
    printf '%s\n' 'basicConstraints=critical,CA:FALSE' 'keyUsage=critical,digitalSignature,keyEncipherment' \
        'extendedKeyUsage=serverAuth' 'subjectAltName=IP:127.0.0.1,DNS:localhost' \
        'authorityKeyIdentifier=keyid' 'subjectKeyIdentifier=hash' >"$pki/server.ext"
    openssl x509 -req -sha256 -days 3650 -in "$pki/server.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
        -CAcreateserial -extfile "$pki/server.ext" -out "$pki/server.crt" 2>/dev/null
    openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
    openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
    openssl rand -hex 32 >"$STATE_DIR/token"
    printf '%s,admin,admin,system:masters\n' "$(cat "$STATE_DIR/token")" >"$STATE_DIR/tokens.csv"
    chmod 0600 "$STATE_DIR/token" "$STATE_DIR/tokens.csv"
}

start_daemons() {
    local binary=$1
    # The link gives the process the name kube-apiserver (the cached file's name carries the version).
    mkdir -p "$STATE_DIR/bin" "$STATE_DIR/etcd"
    ln -sfn "$binary" "$STATE_DIR/bin/kube-apiserver"
    # shellcheck disable=SC2046 # three numbers
    set -- $(kubeapi free-ports 3)
    printf '%s %s %s\n' "$1" "$2" "$3" >"$STATE_DIR/ports"
    load_ports

    say "starting etcd on 127.0.0.1:$ETCD_PORT"
    # 9>&-: a daemon must not inherit the lock, or it holds it for its lifetime.
    setsid /usr/bin/etcd --name default --data-dir "$STATE_DIR/etcd" \
        --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
        --listen-peer-urls "http://127.0.0.1:$PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$PEER_PORT" \
        --initial-cluster "default=http://127.0.0.1:$PEER_PORT" --listen-metrics-urls '' \
        </dev/null >"$STATE_DIR/etcd.log" 2>&1 9>&- &
    echo $! >"$STATE_DIR/etcd.pid"
    wait_for etcd etcd_healthy

    say "starting kube-apiserver on 127.0.0.1:$API_PORT"
    local pki="$STATE_DIR/pki"
    setsid "$STATE_DIR/bin/kube-apiserver" --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
        --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$API_PORT" \
        --tls-cert-file="$pki/server.crt" --tls-private-key-file="$pki/server.key" \
        --token-auth-file="$STATE_DIR/tokens.csv" --authorization-mode=RBAC \
        --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
        --service-account-issuer=https://kubernetes.default.svc --service-cluster-ip-range=10.0.0.0/24 \
        --disable-admission-plugins=ServiceAccount \
        </dev/null >"$STATE_DIR/kube-apiserver.log" 2>&1 9>&- &
    echo $! >"$STATE_DIR/kube-apiserver.pid"
    wait_for kube-apiserver apiserver_ready
}

write_kubeconfigs() {
    kubeapi write-kubeconfig "$STATE_DIR/kubeconfig" --context "$CONTEXT" --server "$(server_url)" \
        --ca "$STATE_DIR/pki/ca.crt" --token-file "$STATE_DIR/token"
    kubeapi merge-kubeconfig "$STATE_DIR/kubeconfig" "$(default_kubeconfig)"
    say "context $CONTEXT is current in $(default_kubeconfig)"
}

install_crds() {
    local f shipped=() stripped=()
    for f in "${CRDS_AS_SHIPPED[@]}"; do shipped+=("$CRD_SRC/$f"); done
    for f in "${CRDS_STRIPPED[@]}"; do stripped+=("$CRD_SRC/$f"); done
    rm -rf "$STATE_DIR/crds"
    "$PY" "$HELPERS/strip_crds.py" "$STATE_DIR/crds" "${stripped[@]}"
    kubeapi apply "$STATE_DIR/kubeconfig" "${shipped[@]}" "$STATE_DIR"/crds/*.json | sed 's/^/local-k8s: /'
    kubeapi wait-established "$STATE_DIR/kubeconfig" "$WAIT_S" "${CRD_NAMES[@]}"
    for f in "${OBJECTS[@]}"; do
        kubeapi apply "$STATE_DIR/kubeconfig" "$CRD_SRC/$f" | sed 's/^/local-k8s: /'
    done
}

report() {
    say "up: $(server_url) (context $CONTEXT; kubeconfig also in $STATE_DIR/kubeconfig)"
    crd_status
    if node_present; then node_status; fi
}

# With HPCTRAIN_K8S_NODES=N: the node parts, (re)started unless they run with N Ready nodes.
ensure_nodes() {
    [ "$NODES" = 0 ] && return 0
    check_node_settings
    node_present && nodes_ok "$NODES" && return 0
    stop_nodes
    start_nodes
}

# The CRDs' state; with HPCTRAIN_K8S_NO_CRDS=1 there are none to report.
crd_status() {
    if [ "$NO_CRDS" = 1 ]; then
        say "no Kubeflow CRDs (HPCTRAIN_K8S_NO_CRDS=1)"
        return 0
    fi
    kubeapi crd-status "$STATE_DIR/kubeconfig" "${CRD_NAMES[@]}"
}

take_lock() {
    mkdir -p "$(dirname "$LOCK_FILE")"
    exec 9>"$LOCK_FILE"
    flock -w 1800 9 || die "another local-k8s.sh held $LOCK_FILE for 30 minutes; is one stuck? (fuser -v $LOCK_FILE)"
}

cmd_up() {
    need_root up
    check_state_dir
    take_lock
    apt_install "${RUN_PACKAGES[@]}"
    [ -d "$CRD_SRC" ] || die "$CRD_SRC is missing: run this script from an hpctrain checkout"

    # Running daemons are never started afresh (that ends every test's objects at once): a server slow to answer
    # under load is waited for.
    if load_ports 2>/dev/null && daemons_running; then
        wait_for "the running kube-apiserver (its /readyz; if it never answers, 'scripts/local-k8s.sh down' then 'up' starts afresh)" apiserver_ready
        kubeapi has-context "$CONTEXT" "$(default_kubeconfig)" || write_kubeconfigs
        crd_status >/dev/null || install_crds
        ensure_nodes
        say "already up"
        report
        return 0
    fi

    if [ -e "$STATE_DIR" ]; then
        say "cleaning up previous state in $STATE_DIR"
        load_ports || true
        stop_nodes
        stop_daemons
        rm -rf --one-file-system "$STATE_DIR"
    fi

    local binary
    # With nodes, every program they need too, in one build (one make shares the compilation).
    [ "$NODES" = 0 ] || [ -n "${HPCTRAIN_K8S_APISERVER:-}" ] || build_missing "${COMPONENTS[@]}"
    binary=$(apiserver_binary)
    say "kube-apiserver: $binary"
    mkdir -p "$STATE_DIR"
    make_credentials
    start_daemons "$binary"
    write_kubeconfigs
    [ "$NO_CRDS" = 1 ] || install_crds
    ensure_nodes
    report
}

cmd_down() {
    need_root down
    check_state_dir
    take_lock
    if [ -e "$STATE_DIR" ]; then
        stop_nodes
        say "stopping kube-apiserver and etcd"
        stop_daemons
    fi
    if [ -f "$(default_kubeconfig)" ] && "$PY" -c 'import yaml' 2>/dev/null; then
        kubeapi remove-context "$CONTEXT" "$(default_kubeconfig)"
    fi
    rm -rf --one-file-system "$STATE_DIR"
    say "down (the cached builds in $CACHE_DIR stay)"
}

cmd_status() {
    if [ -e "$STATE_DIR" ] && [ ! -r "$STATE_DIR/ports" ]; then
        say "cannot read $STATE_DIR: run as root"
        return 1
    fi
    if ! load_ports 2>/dev/null; then
        say "down (no state in $STATE_DIR)"
        return 1
    fi
    if ! daemons_running; then
        say "down: etcd or kube-apiserver is not running (state in $STATE_DIR; run 'up' to restart)"
        return 1
    fi
    if ! apiserver_ready; then
        say "not ready: $(server_url)/readyz does not answer ok"
        return 1
    fi
    say "up: $(server_url), context $CONTEXT"
    crd_status || return 1
    if node_present; then node_status; fi
}

case "${1:-}" in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    build) need_root build; build_missing "${COMPONENTS[@]}"; for c in "${COMPONENTS[@]}"; do cached_binary "$c"; done ;;
    *)
        echo "usage: $0 up|down|status" >&2
        exit 2
        ;;
esac
