#!/usr/bin/env bash
# Data-parallel replicas across a Ray cluster: one `generate`, N replicas of TP 1, 2 or 4 GPUs each,
# placed by Ray on every node (e.g. 8 nodes x 8 GPUs = 64 replicas of an 8B model at TP=1).
#
#   node A (head):     launch/ray_cluster_dp.sh head      # starts Ray, waits for the nodes, checks them, generates
#   other nodes:       launch/ray_cluster_dp.sh worker    # joins Ray and stays until you stop it
#
# Start the workers after the head's `ray start`, one shell on each other node.
# Each replica is a Ray actor with its own vLLM engine on TP GPUs of one node (a placement group
# per replica); every turn's batch is split across the replicas by session and gathered back,
# and a session stays on its replica (its prefix cache). A replica that dies is restarted and its
# unfinished requests resent (docs/engines.md, "Data-parallel replicas on Ray").
#
# Every node needs the same Python packages (sysbench-gpu, vLLM, Ray, torch: the same versions)
# and the model at the same path: a shared file system or a copy on each node. Nothing is
# downloaded (HF_HUB_OFFLINE=1 is exported before `ray start`, so a model missing on a node fails
# there at once). The head checks every node before generating: it runs a small task on each
# node and stops if a version differs or the model is missing anywhere.
#
# Environment variables (export them BEFORE `ray start`: Ray's workers inherit the environment
# of the node's Ray daemon, not of the shell that runs `generate`):
#   HEAD_IP, NODE_IP    node A's address and this node's own address on the cluster network.
#   NODES               nodes to wait for (default 2); GPUS_PER_NODE (default 8).
#   TP                  GPUs per replica: 1, 2 or 4 (default 1); replicas = NODES x GPUS_PER_NODE / TP.
#   IFNAME              the cluster network interface (eth0, ens5, ib0, ...): when given, it sets
#                       NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME (unless those are set) for TP>1.
#                       Left out, NCCL and Gloo choose. VLLM_HOST_IP is set to NODE_IP.
#   VLLM_PORT           base of the replicas' port ranges (replica r: VLLM_PORT + 100 r; default 20000).
#   RAY_PORT (6379), MODEL, DATA, OUT, GPU_MEM (0.90).
#   RAY_AUTH_TOKEN      Ray 2.60 starts the head with token authentication where ~/.ray/auth_token
#                       exists there; every node then needs the same token (copy the file, or
#                       export RAY_AUTH_MODE=token and RAY_AUTH_TOKEN on each node).
#
# Memory: Llama-3.1-8B bf16 is ~16 GB of weights; at GPU_MEM=0.90 on 80 GB GPUs a TP=1 replica keeps
# ~52 GB of KV cache (~400k tokens at 128 KiB per token). A 72B model needs TP=4 (~36 GB of weights
# and ~30 GB of KV per GPU); docs/engines.md has the arithmetic.
# Resume: rerun the head command with the same OUT (Ray may stay up in between).
set -euo pipefail

ROLE="${1:?usage: $0 head|worker}"
HEAD_IP="${HEAD_IP:?set HEAD_IP to node A's cluster address}"
NODE_IP="${NODE_IP:?set NODE_IP to this node's cluster address}"
RAY_PORT="${RAY_PORT:-6379}"
IFNAME="${IFNAME:-}"
NODES="${NODES:-2}"
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"
TP="${TP:-1}"

MODEL="${MODEL:-meta-llama/Llama-3.1-8B-Instruct}"
DATA="${DATA:-system_benchmark_eval_datas.json}"
OUT="${OUT:-runs/llama3.1-8b-instruct-cluster}"
GPU_MEM="${GPU_MEM:-0.90}"

case "$TP" in
  1|2|4) ;;
  *) echo "$0: TP=$TP: replicas here take 1, 2 or 4 GPUs of one node" >&2; exit 2 ;;
esac
if [ $((GPUS_PER_NODE % TP)) -ne 0 ]; then
  echo "$0: TP=$TP does not divide GPUS_PER_NODE=$GPUS_PER_NODE (a replica's GPUs are on one node)" >&2
  exit 2
fi
DP=$((NODES * GPUS_PER_NODE / TP))

export VLLM_HOST_IP="$NODE_IP"
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"       # every node has the model already; nothing downloads
. "$(dirname "${BASH_SOURCE[0]}")/lib/cluster_net.sh"
use_cluster_interface

case "$ROLE" in
  head)
    ray start --head --port "$RAY_PORT" --node-ip-address "$NODE_IP" --num-gpus "$GPUS_PER_NODE"
    echo "waiting for $NODES nodes (start '$0 worker' on the others)..." >&2
    wait_for_ray_nodes "$NODES"
    ray status
    # What can be checked from here: each node's versions and the model's presence, by a task on that node.
    python - "$MODEL" <<'CHECK'
import importlib.metadata as metadata
import os
import socket
import sys

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

MODEL = sys.argv[1]


def facts(model: str) -> dict:
    versions = {}
    for name in ("sysbench-gpu", "vllm", "ray", "torch", "transformers"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    if os.path.isabs(model) or model.startswith("."):
        present = os.path.isdir(model)
    else:  # a hub id: in this node's hub cache (HF_HOME)
        from huggingface_hub import try_to_load_from_cache

        present = isinstance(try_to_load_from_cache(model, "config.json"), str)
    return {"host": socket.gethostname(), "versions": versions, "model_present": present}


ray.init(address="auto", logging_level="ERROR")
probe = ray.remote(num_cpus=0)(facts)
nodes = [n for n in ray.nodes() if n["Alive"]]
found = ray.get(
    [probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(MODEL) for n in nodes]
)
problems = []
reference = found[0]["versions"]
for node, fact in zip(nodes, found):
    print(f"{fact['host']} ({node['NodeManagerAddress']}): {fact['versions']}, model {'present' if fact['model_present'] else 'MISSING'}")
    if fact["versions"] != reference:
        problems.append(f"{fact['host']}: versions differ from {found[0]['host']}'s")
    if not fact["model_present"]:
        problems.append(f"{fact['host']}: {MODEL} is not there")
if problems:
    sys.exit("ray_cluster_dp.sh: " + "; ".join(problems))
CHECK
    echo "generating with $DP replicas x TP $TP over $NODES nodes" >&2
    sysbench-gpu generate \
      --data "$DATA" \
      --model "$MODEL" \
      --engine vllm \
      --out "$OUT" \
      --data-parallel-size "$DP" \
      --tensor-parallel-size "$TP" \
      --ray-address auto \
      --gpu-memory-utilization "$GPU_MEM" \
      --dtype bfloat16
    # sysbench-gpu judge "$OUT" --judge openai --judge-model gpt-4o --concurrency 16
    # sysbench-gpu metrics "$OUT"
    # ray stop    # on every node when done
    ;;
  worker)
    ray start --address "$HEAD_IP:$RAY_PORT" --node-ip-address "$NODE_IP" --num-gpus "$GPUS_PER_NODE" --block
    ;;
  *)
    echo "usage: $0 head|worker" >&2
    exit 2
    ;;
esac
