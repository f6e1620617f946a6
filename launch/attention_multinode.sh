#!/usr/bin/env bash
# System-message attention shares over several nodes: torchrun on every node, one rank per GPU,
# ranks meeting through a c10d rendezvous (no Ray: the attention stage keeps torchrun).
# Each rank loads the whole model onto its own GPU, takes every WORLD_SIZE-th session and
# writes its own shard; rank 0 waits for every rank's done marker and merges (as
# attention_torchrun.sh on one node). Rerunning the same command resumes.
#
#   on every node, the same command (RDZV_HOST is the same address everywhere):
#   NNODES=2 RDZV_HOST=10.0.0.1 launch/attention_multinode.sh RUN_DIR MODEL OUT_DIR [attention options...]
#
# Rules:
#   OUT_DIR must be on a file system every node sees (NFS, Lustre, ...): every rank writes
#   its shards into it and rank 0 reads them all back to merge. RUN_DIR too (every rank
#   reads the run's sessions and replies).
#   Every node needs the same sysbench-gpu, torch and transformers versions and the model
#   at the same path (a shared file system or a copy on each node); nothing is downloaded.
#   The script prints this node's versions and checks that MODEL is there when it is a path.
#
# Environment:
#   NNODES      nodes taking part (default 2); torchrun waits until all have joined.
#   NPROC       ranks on this node (default: its GPUs, else 1).
#   RDZV_HOST   the address of one node (the first, say) that every node can reach; the node
#               whose own address it is hosts the rendezvous store.
#   RDZV_PORT   default 29400.   RDZV_ID: the same on every node (default: from OUT_DIR).
#   LOCAL_ADDR  this node's address on the cluster network, when its hostname does not
#               resolve to it (becomes MASTER_ADDR on rank 0); left out, torchrun looks it up.
#   IFNAME      the cluster network interface: sets GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME
#               (unless set). Only when given.
#   LAYERS (mid,last), DTYPE (bfloat16), TORCHRUN (torchrun).
set -euo pipefail
if [ "$#" -lt 3 ]; then
  echo "usage: NNODES=N RDZV_HOST=ADDR $0 RUN_DIR MODEL OUT_DIR [attention options...]" >&2
  exit 2
fi
RUN_DIR=$1 MODEL=$2 OUT_DIR=$3
shift 3
NNODES="${NNODES:-2}"
RDZV_HOST="${RDZV_HOST:?set RDZV_HOST to the address of the node hosting the rendezvous (the same on every node)}"
RDZV_PORT="${RDZV_PORT:-29400}"
RDZV_ID="${RDZV_ID:-attention-$(printf '%s' "$OUT_DIR" | cksum | cut -d' ' -f1)}"
TORCHRUN="${TORCHRUN:-torchrun}"
NPROC=${NPROC:-$(python -c 'import torch; print(max(torch.cuda.device_count(), 1))')}
IFNAME="${IFNAME:-}"

. "$(dirname "${BASH_SOURCE[0]}")/lib/cluster_net.sh"
use_cluster_interface
# What can be checked from one node: the model path and this node's versions (compare them across nodes).
case "$MODEL" in
  /*|./*|../*)
    if ! [ -e "$MODEL" ]; then
      echo "$0: MODEL=$MODEL is not on this node; every node needs the model at the same path" >&2
      exit 2
    fi
    ;;
esac
python -c 'import sys, torch, transformers, sysbench_gpu; print(f"{sys.argv[1]}: sysbench-gpu {sysbench_gpu.__version__}, torch {torch.__version__}, transformers {transformers.__version__}; the same on every node?", file=sys.stderr)' "$(hostname)"

exec "$TORCHRUN" --nnodes "$NNODES" --nproc-per-node "$NPROC" \
  --rdzv-backend c10d --rdzv-endpoint "$RDZV_HOST:$RDZV_PORT" --rdzv-id "$RDZV_ID" --max-restarts 0 \
  ${LOCAL_ADDR:+--local-addr "$LOCAL_ADDR"} \
  -m sysbench_gpu attention "$RUN_DIR" \
  --model "$MODEL" --out "$OUT_DIR" --layers "${LAYERS:-mid,last}" --dtype "${DTYPE:-bfloat16}" --control "$@"
