#!/usr/bin/env bash
# Two nodes through Ray: tensor parallel within a node, pipeline parallel across nodes.
#
#   node A (head):   launch/ray_two_nodes.sh head       # starts Ray, waits for node B, generates
#   node B (worker): launch/ray_two_nodes.sh worker     # joins Ray and stays until you stop it
#
# Start the worker after the head's `ray start`, from a second shell on node B.
# Both nodes need the same Python environment, sysbench-gpu, `pip install ray`, and the
# model at the same path (a shared file system or a copy on each node).
#
# Environment variables that matter (export them BEFORE `ray start`: Ray's workers inherit
# the environment of the node's Ray daemon, not of the shell that runs `generate`):
#   VLLM_HOST_IP        this node's own address on the cluster network; different on every
#                       node; vLLM uses it to reach the node's workers.
#   IFNAME              the cluster network interface (e.g. eth0, ens5, ib0): when given, it
#                       sets NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME (unless those are set
#                       themselves). Give it when a node has several interfaces and NCCL
#                       picks a wrong one (hangs); left out, NCCL and Gloo choose.
#   NCCL_SOCKET_IFNAME  network interface NCCL uses between nodes; overrides IFNAME.
#   GLOO_SOCKET_IFNAME  the same for Gloo (vLLM's CPU-side process groups); overrides IFNAME.
#   NCCL_IB_HCA         InfiniBand adapters to use (e.g. mlx5), where there is InfiniBand.
#   NCCL_DEBUG=INFO     prints which transport NCCL picked ("via NET/IB" is good; "via
#                       NET/Socket" means plain TCP, slow for pipeline hand-offs).
#
# Memory: Qwen2-72B-Instruct bf16 (~145 GB) over TP 4 x PP 2 = 8 GPUs is ~18 GB of weights
# per GPU, leaving most of each GPU for the KV cache. PP splits the 80 layers into 2 stages.
# Resume: rerun the head command with the same OUT (Ray may stay up in between).
set -euo pipefail

ROLE="${1:?usage: $0 head|worker}"
HEAD_IP="${HEAD_IP:?set HEAD_IP to node A's cluster address}"
NODE_IP="${NODE_IP:?set NODE_IP to this node's cluster address}"
RAY_PORT="${RAY_PORT:-6379}"
IFNAME="${IFNAME:-}"                              # the cluster network interface on this node, if given
GPUS_PER_NODE="${GPUS_PER_NODE:-4}"
NODES=2

MODEL="${MODEL:-Qwen/Qwen2-72B-Instruct}"
DATA="${DATA:-system_benchmark_eval_datas.json}"
OUT="${OUT:-runs/qwen2-72b-instruct-ray}"
GPU_MEM="${GPU_MEM:-0.90}"

export VLLM_HOST_IP="$NODE_IP"
. "$(dirname "${BASH_SOURCE[0]}")/lib/cluster_net.sh"
use_cluster_interface

case "$ROLE" in
  head)
    ray start --head --port "$RAY_PORT" --node-ip-address "$NODE_IP" --num-gpus "$GPUS_PER_NODE"
    echo "waiting for $NODES nodes (start '$0 worker' on node B)..." >&2
    wait_for_ray_nodes "$NODES"
    ray status
    # Runs on the head; vLLM places TP x PP workers through Ray on both nodes.
    sysbench-gpu generate \
      --data "$DATA" \
      --model "$MODEL" \
      --engine vllm \
      --out "$OUT" \
      --tensor-parallel-size "$GPUS_PER_NODE" \
      --pipeline-parallel-size "$NODES" \
      --distributed-executor-backend ray \
      --gpu-memory-utilization "$GPU_MEM" \
      --dtype bfloat16
    # sysbench-gpu judge "$OUT" --judge openai --judge-model gpt-4o --concurrency 16
    # sysbench-gpu metrics "$OUT"
    # ray stop    # on both nodes when done
    ;;
  worker)
    ray start --address "$HEAD_IP:$RAY_PORT" --node-ip-address "$NODE_IP" --num-gpus "$GPUS_PER_NODE" --block
    ;;
  *)
    echo "usage: $0 head|worker" >&2
    exit 2
    ;;
esac
