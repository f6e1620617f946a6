#!/usr/bin/env bash
# An 8B model as 4 data-parallel replicas on one node (one GPU each), all 500 sessions.
#
# sysbench-gpu starts a local Ray (on 127.0.0.1) and 4 replicas as Ray actors, each with its
# own vLLM engine on its own GPU (a placement group per replica; Ray sets each one's
# CUDA_VISIBLE_DEVICES from the GPUs of GPUS), splits every turn's batch across them and
# gathers the replies in input order. A session stays on the replica that served its first
# turn (placed by session id), so its history keeps hitting that replica's prefix cache, also
# when old turns are truncated or the template has no system role. More than one node:
# launch/ray_cluster_dp.sh. Needs Ray: pip install 'sysbench-gpu[gpu]' (or '[ray]').
#
# Ports: replica r scans for free ports from VLLM_PORT + 100 r (VLLM_PORT defaults to 20000),
# so replicas that start together never race for one port. Two jobs on one node: export a
# different VLLM_PORT for each (e.g. VLLM_PORT=30000 for the second).
#
# Memory: bf16 weights are ~16 GB per replica; on an 80 GB H100 with GPU_MEM=0.90 about
# 55 GB per GPU remain for the KV cache (~128 KiB per token: 32 layers x 8 KV heads x
# 128 dims x K and V x 2 bytes), i.e. ~400k cached tokens per replica.
# With tensor parallel inside a replica (TP=2 and 8 GPUs), each replica takes TP GPUs.
#
# Resume: rerun the same command with the same OUT.
set -euo pipefail

MODEL="${MODEL:-meta-llama/Meta-Llama-3.1-8B-Instruct}"
DATA="${DATA:-system_benchmark_eval_datas.json}"
OUT="${OUT:-runs/llama3.1-8b-instruct}"
GPUS="${GPUS:-0,1,2,3}"
DP=4                                              # replicas
TP="${TP:-1}"                                     # GPUs per replica; DP x TP GPUs in GPUS
GPU_MEM="${GPU_MEM:-0.90}"

export CUDA_VISIBLE_DEVICES="$GPUS"

sysbench-gpu generate \
  --data "$DATA" \
  --model "$MODEL" \
  --engine vllm \
  --out "$OUT" \
  --data-parallel-size "$DP" \
  --tensor-parallel-size "$TP" \
  --gpu-memory-utilization "$GPU_MEM" \
  --dtype bfloat16

# sysbench-gpu judge "$OUT" --judge openai --judge-model gpt-4o --concurrency 16
# sysbench-gpu metrics "$OUT"
