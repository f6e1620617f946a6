# Sourced by the multi-node launch scripts: the cluster network interface, and waiting for Ray's nodes.

# IFNAME, only when given: a fixed default (eth0) kills the run on nodes whose interface has another name.
# Sets NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME unless the user set them.
use_cluster_interface() {
  [ -n "${IFNAME:-}" ] || return 0
  if ! [ -e "/sys/class/net/$IFNAME" ]; then
    echo "$0: IFNAME=$IFNAME is not a network interface on this node (have: $(ls /sys/class/net | tr '\n' ' '))" >&2
    exit 2
  fi
  export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-$IFNAME}"
  export GLOO_SOCKET_IFNAME="${GLOO_SOCKET_IFNAME:-$IFNAME}"
}

# Block until the Ray cluster this node joined has $1 live nodes.
wait_for_ray_nodes() {
  until [ "$(python -c 'import ray; ray.init(address="auto", logging_level="ERROR"); print(sum(1 for n in ray.nodes() if n["Alive"]))')" -ge "$1" ]; do
    sleep 5
  done
}
