#!/usr/bin/env bash
# System-message attention shares of Qwen2-72B-Instruct on one node with 4 x H100 80GB:
# tensor parallel 4 under torchrun (transformers' tp_plan), all sessions, system and control arms.
#
# Each rank holds a quarter of every layer: 16 of the 64 query heads and 2 of the 8 KV heads,
# a quarter of the MLP, ~35 GB of bf16 layer weights plus the 2.5 GB embedding table. All four GPUs
# work on every forward; every rank runs every session, captures the heads it holds, the head
# mean is reduced across ranks and only rank 0 writes OUT. No KV cache is kept (one
# teacher-forced forward per session and arm), so activations stay small.
#
#   RUN_DIR=runs/qwen2-72b-instruct launch/attention_qwen2_72b_tp4.sh [extra attention options...]
#
# Resume: run the same command again with the same OUT; finished sessions are skipped. The
# head counts must divide by the number of ranks (64 and 8 do by 2, 4 and 8).
set -euo pipefail

RUN_DIR="${RUN_DIR:-runs/qwen2-72b-instruct}"   # a run directory from generate (launch/qwen2_72b_tp4.sh)
MODEL="${MODEL:-Qwen/Qwen2-72B-Instruct}"       # hub id (already downloaded) or a local folder
OUT="${OUT:-attn/qwen2-72b-instruct}"
GPUS="${GPUS:-0,1,2,3}"                          # four GPUs of this node, NVLink-connected
LAYERS="${LAYERS:-mid,last}"                     # layers 40 and 79 of 80
NPROC=4

export CUDA_VISIBLE_DEVICES="$GPUS"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"   # torchrun would default to 1 thread per rank (tokenizer, merge)

exec torchrun --standalone --nproc-per-node "$NPROC" -m sysbench_gpu attention "$RUN_DIR" \
  --model "$MODEL" --out "$OUT" --tensor-parallel --layers "$LAYERS" --dtype bfloat16 --control "$@"
