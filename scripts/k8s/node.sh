# shellcheck shell=bash
# The node parts of scripts/local-k8s.sh, sourced by it; started when HPCTRAIN_K8S_NODES=N (1 or 2), and
# covered by status and down whenever present:
#   - per node: containerd with its CRI plugin and a kubelet registered as a real node
#     (hpctrain-node-1, hpctrain-node-2), in a mount namespace of their own where the node's own
#     directory is bind-mounted on /var/log/pods (the kubelet hard-codes that path and its garbage
#     collector removes the log directories of every pod it does not know, i.e. the other node's),
#     with its own cgroup root (/hpctrain-node-N) and its own address range on one shared CNI bridge;
#   - kube-scheduler and kube-controller-manager;
#   - two local images, imported into every node's containerd:
#     the pause image, from the kubernetes source's build/pause (the sandbox image), and
#     the training image: an almost empty root file system; the nodes' default runtime bind-mounts
#     the host's /usr, the Python installation, the venv (torch) and the checkout read-only into
#     every container (containerd's base_runtime_spec), so Python, torch and hpctrain are the host's.
#     Copying the venv (gigabytes of torch) into an image would cost minutes on every fresh machine.
# Everything lives under $NODE_DIR; kubelets and containerd listen on 127.0.0.1 or on unix sockets.
# Needs: STATE_DIR, ROOT, HELPERS, PY, NODES, PAUSE_VERSION, say, die, pid_alive, stop_pid,
# wait_for, kubeapi, binary, apt_install (from local-k8s.sh).

NODE_DIR="$STATE_DIR/node"
# Not 10/8, 172.16/12 or 192.168/16: traffic to those is flagged on the development machines.
POD_CIDR="${HPCTRAIN_K8S_POD_CIDR:-100.64.0.0/16}"
BRIDGE=hpctrain0
PAUSE_IMAGE="localhost/hpctrain/pause:$PAUSE_VERSION"
TRAINING_IMAGE=localhost/hpctrain/host-python:1
MAX_NODES=2
# The kubelet sets vm.overcommit_memory, kernel.panic and kernel.panic_on_oops; the bridge plugin turns on
# forwarding. `down` puts back what was there before.
TOUCHED_SYSCTLS=(vm.overcommit_memory kernel.panic kernel.panic_on_oops net.ipv4.ip_forward)

node_present() { [ -d "$NODE_DIR" ]; }
node_name() { printf 'hpctrain-node-%s\n' "$1"; }
node_dir() { printf '%s/%s\n' "$NODE_DIR" "$1"; }
ctr_sock() { printf '%s/containerd/containerd.sock\n' "$(node_dir "$1")"; }
ctr_() { local i=$1; shift; ctr --address "$(ctr_sock "$i")" --namespace k8s.io "$@"; }
kubectl_() { kubectl --kubeconfig "$STATE_DIR/kubeconfig" "$@"; }

# The node numbers present under $NODE_DIR.
node_numbers() {
    local d
    for d in "$NODE_DIR"/[0-9]*; do [ -d "$d" ] && basename "$d"; done
}

check_node_settings() {
    case "$NODES" in
        [1-9]) [ "$NODES" -le "$MAX_NODES" ] || die "HPCTRAIN_K8S_NODES=$NODES: at most $MAX_NODES nodes" ;;
        *) die "HPCTRAIN_K8S_NODES must be a number of nodes (1-$MAX_NODES), not '$NODES'" ;;
    esac
    [[ "$POD_CIDR" =~ ^[0-9]+\.[0-9]+\.0\.0/16$ ]] || die "HPCTRAIN_K8S_POD_CIDR must be a /16 (a.b.0.0/16), not $POD_CIDR"
}

# The API server reaches each kubelet by its node name (the kubelet refuses a loopback node IP and
# listens on 127.0.0.1 only), so the names must resolve to 127.0.0.1.
ensure_hosts_entries() {
    local i name
    for ((i = 1; i <= NODES; i++)); do
        name=$(node_name "$i")
        getent hosts "$name" | grep '^127\.' >/dev/null && continue
        say "adding '127.0.0.1 $name' to /etc/hosts"
        # Append (no sed -i): /etc/hosts may be a bind mount.
        printf '127.0.0.1 %s\n' "$name" >>/etc/hosts
    done
}

save_sysctls() {
    [ -f "$NODE_DIR/sysctl.orig" ] || sysctl "${TOUCHED_SYSCTLS[@]}" | sed 's/ = /=/' >"$NODE_DIR/sysctl.orig"
}

restore_sysctls() {
    [ -f "$NODE_DIR/sysctl.orig" ] || return 0
    xargs sysctl -q -w <"$NODE_DIR/sysctl.orig" >/dev/null || say "warning: could not restore $(cat "$NODE_DIR/sysctl.orig")"
}

# --- per node: cgroup root, containerd, CNI ----------------------------------------------

# /hpctrain-node-N in every cgroup v1 hierarchy (the kubelet wants its --cgroup-root to exist).
make_cgroup_root() {
    local name=$1 h
    for h in /sys/fs/cgroup/*/; do
        if [ -e "$h/cgroup.procs" ] && [ ! -e "$h/cgroup.controllers" ]; then mkdir -p "$h$name"; fi
    done
    if [ -d "/sys/fs/cgroup/cpuset/$name" ]; then
        cat /sys/fs/cgroup/cpuset/cpuset.cpus >"/sys/fs/cgroup/cpuset/$name/cpuset.cpus"
        cat /sys/fs/cgroup/cpuset/cpuset.mems >"/sys/fs/cgroup/cpuset/$name/cpuset.mems"
    fi
}

remove_cgroup_root() {
    local name=$1 h
    for h in /sys/fs/cgroup/*/"$name"; do
        [ -d "$h" ] && find "$h" -depth -type d -exec rmdir {} + 2>/dev/null
    done
    return 0
}

# The OCI runtime spec every container starts from: containerd's default plus read-only binds of
# the host's Python environment at the same paths.
write_base_spec() {
    local out=$1 python_home
    python_home=$(/var/cache/hpctrain/venv/bin/python -c 'import sys; print(sys.base_prefix)' 2>/dev/null) ||
        die "no /var/cache/hpctrain/venv/bin/python: the training image mounts the host's venv"
    ctr oci spec >"$out.default"
    "$PY" - "$out.default" "$out" /usr "$python_home" /var/cache/hpctrain/venv "$ROOT" <<'EOF'
import json, sys
spec = json.load(open(sys.argv[1]))
for path in sys.argv[3:]:
    spec["mounts"].append({"destination": path, "type": "bind", "source": path,
                           "options": ["rbind", "ro", "nosuid", "nodev"]})
json.dump(spec, open(sys.argv[2], "w"), indent=1)
EOF
}

write_containerd_config() {
    local dir=$1 ctr="$1/containerd"
    mkdir -p "$ctr" "$dir/net.d"
    cat >"$ctr/config.toml" <<EOF
version = 2
root = "$ctr/root"
state = "$ctr/state"
[grpc]
  address = "$ctr/containerd.sock"
[ttrpc]
  address = "$ctr/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$ctr/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  netns_mounts_under_state_dir = true
  # Root here lacks CAP_SYS_RESOURCE: no oom_score_adj below containerd's own (the pause container asks -998).
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      base_runtime_spec = "$NODE_DIR/base-spec.json"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$dir/net.d"
EOF
}

# One bridge for all nodes, so pods of different nodes are on one link; node N hands out
# a.b.(N-1).2-254 of the /16, whose a.b.0.1 is the bridge. No default route, no masquerading:
# pods reach each other and the host, nothing beyond.
write_cni_config() {
    local dir=$1 i=$2 prefix="${POD_CIDR%.0.0/16}"
    cat >"$dir/net.d/10-hpctrain.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "hpctrain",
  "plugins": [
    {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$dir/ipam", "ranges": [[{"subnet": "$POD_CIDR",
       "rangeStart": "$prefix.$((i - 1)).2", "rangeEnd": "$prefix.$((i - 1)).254", "gateway": "$prefix.0.1"}]]}},
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "loopback"}
  ]
}
EOF
}

containerd_ready() { ctr --address "$(ctr_sock "$1")" version >/dev/null 2>&1; }

# containerd in a new mount namespace whose /var/log/pods is the node's own logs directory; the
# kubelet joins that namespace. Mounts made in it (root file systems, volumes) stay in it.
start_containerd() {
    local i=$1 dir
    dir=$(node_dir "$i")
    mkdir -p "$dir/logs" /var/log/pods
    write_containerd_config "$dir"
    write_cni_config "$dir" "$i"
    say "starting containerd for $(node_name "$i")"
    # shellcheck disable=SC2016 # expanded by that shell
    setsid unshare --mount --propagation slave /bin/sh -c 'mount --bind "$1" /var/log/pods && shift && exec "$@"' \
        sh "$dir/logs" /usr/bin/containerd --config "$dir/containerd/config.toml" \
        </dev/null >"$dir/containerd.log" 2>&1 9>&- &
    echo $! >"$dir/containerd.pid"
    wait_for "containerd of $(node_name "$i")" containerd_ready "$i"
    ctr_ "$i" images import "$NODE_DIR/images/pause.tar" >/dev/null
    ctr_ "$i" images import "$NODE_DIR/images/training.tar" >/dev/null
}

# --- images -----------------------------------------------------------------------

make_images() {
    local img="$NODE_DIR/images" pause dirs=() d
    pause=$(binary pause)
    mkdir -p "$img"
    write_base_spec "$NODE_DIR/base-spec.json"
    "$PY" "$HELPERS/oci_image.py" "$img/pause.tar" "$PAUSE_IMAGE" --file "$pause:/pause:755" --entrypoint '["/pause"]'
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' >"$img/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$img/group"
    for d in /proc /sys /dev /tmp /etc /usr /var /var/tmp /run /root /home; do dirs+=(--dir "$d"); done
    "$PY" "$HELPERS/oci_image.py" "$img/training.tar" "$TRAINING_IMAGE" "${dirs[@]}" \
        --symlink /bin:usr/bin --symlink /sbin:usr/sbin --symlink /lib:usr/lib --symlink /lib64:usr/lib64 \
        --file "$img/passwd:/etc/passwd" --file "$img/group:/etc/group" \
        --env PATH=/var/cache/hpctrain/venv/bin:/usr/local/bin:/usr/bin:/bin --env "PYTHONPATH=$ROOT/src" \
        --env HOME=/root
    echo "$ROOT" >"$img/checkout"
    say "images: $PAUSE_IMAGE, $TRAINING_IMAGE (hpctrain from $ROOT/src)"
}

# --- kubelet, scheduler, controller manager ----------------------------------------

write_kubelet_config() {
    local dir=$1 name=$2 port=$3 healthz=$4
    cat >"$dir/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: $port
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $healthz
# The API server reaches the kubelet on 127.0.0.1 without a client certificate.
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
cgroupRoot: /$name
failSwapOn: false
makeIPTablesUtilChains: false
volumePluginDir: $dir/kubelet/volume-plugins
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
evictionHard: {memory.available: 100Mi, nodefs.available: 5%, imagefs.available: 5%}
# No image garbage collection: the local images cannot be pulled again, and the disk is the machine's own (other
# files fill it): at 85% a kubelet removed the pause and training images between two CI runs, and every later pod
# failed. 100 never triggers it.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# A memory-backed emptyDir (/dev/shm) gets its sizeLimit as the tmpfs size (alpha in 1.20; else half the RAM).
featureGates: {SizeMemoryBackedVolumes: true}
EOF
}

kubelet_ready() {
    curl -s --max-time 2 "http://127.0.0.1:$(cat "$(node_dir "$1")/kubelet/healthz-port")/healthz" | grep -q ok
}

start_kubelet() {
    local i=$1 dir name sock ns
    dir=$(node_dir "$i")
    name=$(node_name "$i")
    sock=$(ctr_sock "$i")
    ns="/proc/$(cat "$dir/containerd.pid")/ns/mnt"
    mkdir -p "$dir/kubelet"
    make_cgroup_root "$name"
    # shellcheck disable=SC2046 # two numbers
    set -- $(kubeapi free-ports 2)
    echo "$2" >"$dir/kubelet/healthz-port"
    write_kubelet_config "$dir" "$name" "$1" "$2"
    say "starting the kubelet of $name (127.0.0.1:$1)"
    setsid nsenter --mount="$ns" "$STATE_DIR/bin/kubelet" --config "$dir/kubelet/config.yaml" \
        --kubeconfig "$STATE_DIR/kubeconfig" --root-dir "$dir/kubelet/root" --hostname-override "$name" \
        --container-runtime=remote --container-runtime-endpoint="unix://$sock" \
        --image-service-endpoint="unix://$sock" --runtime-request-timeout=10m \
        </dev/null >"$dir/kubelet.log" 2>&1 9>&- &
    echo $! >"$dir/kubelet.pid"
    wait_for "kubelet of $name" kubelet_ready "$i"
}

start_control_loops() {
    local pki="$STATE_DIR/pki"
    say "starting kube-scheduler and kube-controller-manager"
    setsid "$STATE_DIR/bin/kube-scheduler" --kubeconfig "$STATE_DIR/kubeconfig" --leader-elect=false \
        --port=0 --secure-port=0 </dev/null >"$NODE_DIR/kube-scheduler.log" 2>&1 9>&- &
    echo $! >"$NODE_DIR/kube-scheduler.pid"
    setsid "$STATE_DIR/bin/kube-controller-manager" --kubeconfig "$STATE_DIR/kubeconfig" --leader-elect=false \
        --port=0 --secure-port=0 --service-account-private-key-file="$pki/sa.key" --root-ca-file="$pki/ca.crt" \
        --use-service-account-credentials=false --controllers='*,-nodeipam,-service,-route,-cloud-node-lifecycle' \
        </dev/null >"$NODE_DIR/kube-controller-manager.log" 2>&1 9>&- &
    echo $! >"$NODE_DIR/kube-controller-manager.pid"
}

link_binaries() {
    local c
    mkdir -p "$STATE_DIR/bin"
    # The links give the processes their names (the cached files' names carry the version).
    for c in kubelet kube-scheduler kube-controller-manager; do ln -sfn "$(binary "$c")" "$STATE_DIR/bin/$c"; done
}

node_ready() {
    [ "$(kubectl_ get node "$(node_name "$1")" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}

# All node parts run, one node per number up to $1, every node is Ready, runs the kubelet configuration this
# script writes now (one started by an older script is restarted) and holds both local images.
nodes_ok() {
    local want=$1 i dir
    [ "$(node_numbers | wc -l)" -eq "$want" ] || return 1
    # The training image runs hpctrain from the checkout that made it (PYTHONPATH): another checkout restarts the
    # node, or its pods would run a deleted clone's code (or none).
    local made_for
    made_for=$(cat "$NODE_DIR/images/checkout" 2>/dev/null) || made_for="an unknown checkout"
    if [ "$made_for" != "$ROOT" ]; then
        say "the node's training image runs hpctrain from $made_for, not $ROOT: restarting the node"
        return 1
    fi
    pid_alive "$NODE_DIR/kube-scheduler.pid" kube-scheduler || return 1
    pid_alive "$NODE_DIR/kube-controller-manager.pid" kube-controller-manager || return 1
    for ((i = 1; i <= want; i++)); do
        dir=$(node_dir "$i")
        pid_alive "$dir/containerd.pid" containerd && pid_alive "$dir/kubelet.pid" kubelet && node_ready "$i" &&
            grep -qx 'imageGCHighThresholdPercent: 100' "$dir/kubelet/config.yaml" && images_present "$i" || return 1
    done
}

images_present() {
    local listed
    listed=$(ctr_ "$1" images ls -q 2>/dev/null) || return 1
    grep -qx "$PAUSE_IMAGE" <<<"$listed" && grep -qx "$TRAINING_IMAGE" <<<"$listed"
}

start_nodes() {
    local t0=$SECONDS i
    check_node_settings
    apt_install "${NODE_PACKAGES[@]}"
    # kubectl waits for the nodes here; a fresh Debian machine has none: Debian's own matches the server (1.20).
    command -v kubectl >/dev/null 2>&1 || apt_install kubernetes-client
    command -v kubectl >/dev/null 2>&1 || die "the node parts need kubectl on PATH (Debian package kubernetes-client)"
    ensure_hosts_entries
    link_binaries
    mkdir -p "$NODE_DIR"
    save_sysctls
    make_images
    for ((i = 1; i <= NODES; i++)); do
        start_containerd "$i"
        start_kubelet "$i"
    done
    start_control_loops
    for ((i = 1; i <= NODES; i++)); do wait_for "node $(node_name "$i")" node_ready "$i"; done
    say "$NODES node(s) Ready after $((SECONDS - t0)) s"
}

# --- status and stopping --------------------------------------------------------------

node_status() {
    local i d ok=0 dir
    for d in kube-scheduler kube-controller-manager; do
        pid_alive "$NODE_DIR/$d.pid" "$d" || { say "$d is not running (log: $NODE_DIR/$d.log)"; ok=1; }
    done
    for i in $(node_numbers); do
        dir=$(node_dir "$i")
        for d in containerd kubelet; do
            pid_alive "$dir/$d.pid" "$d" || { say "$(node_name "$i"): $d is not running (log: $dir/$d.log)"; ok=1; }
        done
        if node_ready "$i"; then say "node $(node_name "$i"): Ready"; else say "node $(node_name "$i"): not Ready"; ok=1; fi
    done
    say "pod network: $POD_CIDR (bridge $BRIDGE)"
    if ctr_ 1 images ls -q 2>/dev/null | grep -x "$TRAINING_IMAGE" >/dev/null; then
        say "training image: $TRAINING_IMAGE"
    else
        say "training image: missing ($TRAINING_IMAGE is not in containerd)"
        ok=1
    fi
    if ! ctr_ 1 images ls -q 2>/dev/null | grep -x "$PAUSE_IMAGE" >/dev/null; then
        say "pause image: missing ($PAUSE_IMAGE is not in containerd: no pod can start)"
        ok=1
    fi
    return "$ok"
}

# Kill every container of node N and drop it, so that no mount is left behind.
remove_containers() {
    local i=$1 id
    containerd_ready "$i" || return 0
    for id in $(ctr_ "$i" tasks ls -q 2>/dev/null); do ctr_ "$i" tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true; done
    sleep 1
    for id in $(ctr_ "$i" tasks ls -q 2>/dev/null); do ctr_ "$i" tasks delete -f "$id" >/dev/null 2>&1 || true; done
    for id in $(ctr_ "$i" containers ls -q 2>/dev/null); do ctr_ "$i" containers delete "$id" >/dev/null 2>&1 || true; done
}

# Unmount whatever this mount namespace still has under $NODE_DIR, deepest first, so that removing
# the directory can never reach into a mounted file system.
unmount_node_dir() {
    local m
    { findmnt -rn -o TARGET | grep -F "$NODE_DIR/" || true; } | sort -r | while read -r m; do
        umount -l "$m" 2>/dev/null || true
    done
    if findmnt -rn -o TARGET | grep -F "$NODE_DIR/" >/dev/null; then
        die "still mounted under $NODE_DIR: $(findmnt -rn -o TARGET | grep -F "$NODE_DIR/" | head -n 3)"
    fi
}

stop_node() {
    local i dir
    i=$1
    dir=$(node_dir "$i")
    stop_pid "$dir/kubelet.pid" kubelet
    remove_containers "$i"
    stop_pid "$dir/containerd.pid" containerd
    remove_cgroup_root "$(node_name "$i")"
}

stop_nodes() {
    local i
    node_present || return 0
    say "stopping the nodes (kubelets, containers, containerd), the scheduler and the controller manager"
    stop_pid "$NODE_DIR/kube-scheduler.pid" kube-scheduler
    stop_pid "$NODE_DIR/kube-controller-manager.pid" kube-controller-manager
    for i in $(node_numbers); do stop_node "$i"; done
    unmount_node_dir
    ip link del "$BRIDGE" 2>/dev/null || true
    restore_sysctls
    rm -rf --one-file-system "$NODE_DIR"
}
