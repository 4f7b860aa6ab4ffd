# shellcheck shell=bash
# The node parts of scripts/local-k8s.sh, sourced by it when HPCTRAIN_K8S_NODES=1 (or when they are
# present, for status and down): containerd with its CRI plugin, a CNI bridge, one kubelet registered
# as a real node, kube-scheduler, kube-controller-manager, and two local images:
#   - the pause image, from the kubernetes source's build/pause (the sandbox image);
#   - the training image: an almost empty root file system; the node's default runtime bind-mounts
#     the host's /usr, the Python installation, the venv (torch) and the checkout read-only into
#     every container (containerd's base_runtime_spec), so Python, torch and hpctrain are the host's.
#     Copying the venv (gigabytes of torch) into an image would cost minutes on every fresh machine.
# Everything lives under $NODE_DIR; the kubelet and containerd listen on 127.0.0.1 or on unix sockets.
# Needs: STATE_DIR, CACHE_DIR, ROOT, HELPERS, PY, WAIT_S, say, die, pid_alive, stop_pid, wait_for,
# kubeapi, server_url, binary, apt_install (from local-k8s.sh).

NODE_DIR="$STATE_DIR/node"
CTR_DIR="$NODE_DIR/containerd"
CTR_SOCK="$CTR_DIR/containerd.sock"
CNI_DIR="$NODE_DIR/cni"
KUBELET_DIR="$NODE_DIR/kubelet"
# Not 10/8, 172.16/12 or 192.168/16: traffic to those is flagged on the development machines.
POD_CIDR="${HPCTRAIN_K8S_POD_CIDR:-100.64.0.0/16}"
BRIDGE=hpctrain0
PAUSE_IMAGE="localhost/hpctrain/pause:$PAUSE_VERSION"
TRAINING_IMAGE=localhost/hpctrain/host-python:1
NODE_DAEMONS=(kube-controller-manager kube-scheduler kubelet containerd)

# The kubelet sets vm.overcommit_memory, kernel.panic and kernel.panic_on_oops; the bridge plugin turns on
# forwarding. `down` puts back what was there before.
TOUCHED_SYSCTLS=(vm.overcommit_memory kernel.panic kernel.panic_on_oops net.ipv4.ip_forward)

node_present() { [ -d "$NODE_DIR" ]; }

save_sysctls() {
    [ -f "$NODE_DIR/sysctl.orig" ] || sysctl "${TOUCHED_SYSCTLS[@]}" | sed 's/ = /=/' >"$NODE_DIR/sysctl.orig"
}

restore_sysctls() {
    [ -f "$NODE_DIR/sysctl.orig" ] || return 0
    xargs sysctl -q -w <"$NODE_DIR/sysctl.orig" >/dev/null || say "warning: could not restore $(cat "$NODE_DIR/sysctl.orig")"
}

ctr_() { ctr --address "$CTR_SOCK" --namespace k8s.io "$@"; }

kubectl_() { kubectl --kubeconfig "$STATE_DIR/kubeconfig" "$@"; }

# The node's name: the host name when it resolves to a loopback address (the API server reaches the
# kubelet by it, and the kubelet listens on 127.0.0.1 only), else localhost.
node_name() {
    local name
    name=$(hostname)
    if getent hosts "$name" | grep -q '^127\.'; then printf '%s\n' "$name"; else echo localhost; fi
}

# --- containerd -------------------------------------------------------------------

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
    mkdir -p "$CTR_DIR" "$CNI_DIR/net.d"
    write_base_spec "$CTR_DIR/base-spec.json"
    cat >"$CTR_DIR/config.toml" <<EOF
version = 2
root = "$CTR_DIR/root"
state = "$CTR_DIR/state"
[grpc]
  address = "$CTR_SOCK"
[ttrpc]
  address = "$CTR_SOCK.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$CTR_DIR/opt"
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
      base_runtime_spec = "$CTR_DIR/base-spec.json"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$CNI_DIR/net.d"
EOF
}

# A bridge with host-local addresses from $POD_CIDR; no default route and no masquerading, so pods
# reach each other and the host, nothing beyond.
write_cni_config() {
    cat >"$CNI_DIR/net.d/10-hpctrain.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "hpctrain",
  "plugins": [
    {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]], "dataDir": "$CNI_DIR/ipam"}},
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "loopback"}
  ]
}
EOF
}

containerd_ready() { ctr --address "$CTR_SOCK" version >/dev/null 2>&1; }

start_containerd() {
    write_containerd_config
    write_cni_config
    say "starting containerd ($CTR_SOCK)"
    setsid /usr/bin/containerd --config "$CTR_DIR/config.toml" </dev/null >"$NODE_DIR/containerd.log" 2>&1 9>&- &
    echo $! >"$NODE_DIR/containerd.pid"
    wait_for containerd containerd_ready
}

# --- images -----------------------------------------------------------------------

make_images() {
    local img="$NODE_DIR/images" pause
    pause=$(binary pause)
    mkdir -p "$img"
    "$PY" "$HELPERS/oci_image.py" "$img/pause.tar" "$PAUSE_IMAGE" --file "$pause:/pause:755" --entrypoint '["/pause"]'
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' >"$img/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$img/group"
    local dirs=() d
    for d in /proc /sys /dev /tmp /etc /usr /var /var/tmp /run /root /home; do dirs+=(--dir "$d"); done
    "$PY" "$HELPERS/oci_image.py" "$img/training.tar" "$TRAINING_IMAGE" "${dirs[@]}" \
        --symlink /bin:usr/bin --symlink /sbin:usr/sbin --symlink /lib:usr/lib --symlink /lib64:usr/lib64 \
        --file "$img/passwd:/etc/passwd" --file "$img/group:/etc/group" \
        --env PATH=/var/cache/hpctrain/venv/bin:/usr/local/bin:/usr/bin:/bin --env "PYTHONPATH=$ROOT/src" \
        --env HOME=/root
    ctr_ images import "$img/pause.tar" >/dev/null
    ctr_ images import "$img/training.tar" >/dev/null
    say "images: $PAUSE_IMAGE, $TRAINING_IMAGE"
}

# --- kubelet, scheduler, controller manager ----------------------------------------

write_kubelet_config() {
    local port=$1 healthz=$2
    cat >"$KUBELET_DIR/config.yaml" <<EOF
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
failSwapOn: false
makeIPTablesUtilChains: false
volumePluginDir: $KUBELET_DIR/volume-plugins
podCIDR: $POD_CIDR
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
evictionHard: {memory.available: 100Mi, nodefs.available: 5%, imagefs.available: 5%}
EOF
}

kubelet_ready() { curl -s --max-time 2 "http://127.0.0.1:$(cat "$KUBELET_DIR/healthz-port")/healthz" | grep -q ok; }

start_kubelet() {
    mkdir -p "$KUBELET_DIR"
    # shellcheck disable=SC2046 # two numbers
    set -- $(kubeapi free-ports 2)
    echo "$2" >"$KUBELET_DIR/healthz-port"
    write_kubelet_config "$1" "$2"
    ln -sfn "$(binary kubelet)" "$STATE_DIR/bin/kubelet"
    say "starting kubelet (node $(node_name), port $1)"
    setsid "$STATE_DIR/bin/kubelet" --config "$KUBELET_DIR/config.yaml" --kubeconfig "$STATE_DIR/kubeconfig" \
        --root-dir "$KUBELET_DIR/root" --hostname-override "$(node_name)" \
        --container-runtime=remote --container-runtime-endpoint="unix://$CTR_SOCK" \
        --image-service-endpoint="unix://$CTR_SOCK" --runtime-request-timeout=10m \
        </dev/null >"$NODE_DIR/kubelet.log" 2>&1 9>&- &
    echo $! >"$NODE_DIR/kubelet.pid"
    wait_for kubelet kubelet_ready
}

start_control_loops() {
    local pki="$STATE_DIR/pki"
    ln -sfn "$(binary kube-scheduler)" "$STATE_DIR/bin/kube-scheduler"
    ln -sfn "$(binary kube-controller-manager)" "$STATE_DIR/bin/kube-controller-manager"
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

node_ready() {
    [ "$(kubectl_ get node "$(node_name)" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}

node_daemons_running() {
    local d
    for d in "${NODE_DAEMONS[@]}"; do pid_alive "$NODE_DIR/$d.pid" "$d" || return 1; done
}

start_node() {
    local t0=$SECONDS
    apt_install "${NODE_PACKAGES[@]}"
    command -v kubectl >/dev/null 2>&1 || die "the node parts need kubectl on PATH"
    mkdir -p "$NODE_DIR" "$STATE_DIR/bin"
    save_sysctls
    start_containerd
    make_images
    start_kubelet
    start_control_loops
    wait_for "node $(node_name)" node_ready
    say "node $(node_name) Ready after $((SECONDS - t0)) s"
}

# --- status and stopping --------------------------------------------------------------

node_status() {
    local d ok=0
    for d in "${NODE_DAEMONS[@]}"; do
        pid_alive "$NODE_DIR/$d.pid" "$d" || { say "node: $d is not running (log: $NODE_DIR/$d.log)"; ok=1; }
    done
    if node_ready; then say "node $(node_name): Ready (pod network $POD_CIDR)"; else say "node $(node_name): not Ready"; ok=1; fi
    if ctr_ images ls -q 2>/dev/null | grep -qx "$TRAINING_IMAGE"; then
        say "training image: $TRAINING_IMAGE"
    else
        say "training image: missing ($TRAINING_IMAGE is not in containerd)"
        ok=1
    fi
    return "$ok"
}

# Kill every container of the k8s.io namespace and drop it, so that no mount is left behind.
remove_containers() {
    local id
    containerd_ready || return 0
    for id in $(ctr_ tasks ls -q 2>/dev/null); do
        ctr_ tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true
    done
    sleep 1
    for id in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks delete -f "$id" >/dev/null 2>&1 || true; done
    for id in $(ctr_ containers ls -q 2>/dev/null); do ctr_ containers delete "$id" >/dev/null 2>&1 || true; done
}

# Unmount whatever is still mounted under $NODE_DIR (volumes, network namespaces, root file systems),
# deepest first, so that removing the directory can never reach into a bind-mounted host directory.
unmount_node_dir() {
    local m
    findmnt -rn -o TARGET | grep -F "$NODE_DIR/" | sort -r | while read -r m; do
        umount -l "$m" 2>/dev/null || true
    done
    if findmnt -rn -o TARGET | grep -qF "$NODE_DIR/"; then
        die "still mounted under $NODE_DIR: $(findmnt -rn -o TARGET | grep -F "$NODE_DIR/" | head -n 3)"
    fi
}

stop_node() {
    node_present || return 0
    say "stopping the node (kubelet, containers, containerd, scheduler, controller manager)"
    stop_pid "$NODE_DIR/kubelet.pid" kubelet
    stop_pid "$NODE_DIR/kube-scheduler.pid" kube-scheduler
    stop_pid "$NODE_DIR/kube-controller-manager.pid" kube-controller-manager
    remove_containers
    stop_pid "$NODE_DIR/containerd.pid" containerd
    pkill -KILL -f "containerd-shim-runc-v2 .*-address $CTR_SOCK" 2>/dev/null || true
    unmount_node_dir
    ip link del "$BRIDGE" 2>/dev/null || true
    restore_sysctls
    rm -rf --one-file-system "$NODE_DIR"
}
