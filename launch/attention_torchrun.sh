#!/usr/bin/env bash
# System-message attention shares for every session, one process per GPU (data parallel).
# Each rank binds cuda:LOCAL_RANK and loads the whole model straight onto it, so the model
# must fit one GPU; it takes every WORLD_SIZE-th session and writes its own shard; rank 0 merges.
# A model larger than one GPU: attention_qwen2_72b_tp4.sh (tensor parallel) or attention_device_map.sh.
# Rerunning the same command resumes (finished sessions are skipped).
#
#   launch/attention_torchrun.sh RUN_DIR MODEL OUT_DIR [extra attention options...]
#   NPROC=8 launch/attention_torchrun.sh runs/qwen2-7b Qwen/Qwen2-7B-Instruct attn/qwen2-7b --control
set -euo pipefail
if [ "$#" -lt 3 ]; then
  echo "usage: $0 RUN_DIR MODEL OUT_DIR [attention options...]" >&2
  exit 2
fi
RUN_DIR=$1 MODEL=$2 OUT_DIR=$3
shift 3
NPROC=${NPROC:-$(python -c 'import torch; print(max(torch.cuda.device_count(), 1))')}
exec torchrun --standalone --nproc-per-node "$NPROC" -m sysbench_gpu attention "$RUN_DIR" \
  --model "$MODEL" --out "$OUT_DIR" --layers "${LAYERS:-mid,last}" --dtype "${DTYPE:-bfloat16}" --control "$@"
