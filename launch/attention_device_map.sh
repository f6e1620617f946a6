#!/usr/bin/env bash
# System-message attention shares with a model larger than one GPU: one process,
# layers spread over all visible GPUs by accelerate (device_map=auto). The capture
# runs on whichever GPU holds each selected layer. Only one GPU computes at a time: where
# transformers can split the model by tensor parallelism, attention_qwen2_72b_tp4.sh is faster.
#
#   launch/attention_device_map.sh RUN_DIR MODEL OUT_DIR [extra attention options...]
#   CUDA_VISIBLE_DEVICES=0,1,2,3 launch/attention_device_map.sh runs/qwen2-72b Qwen/Qwen2-72B-Instruct attn/qwen2-72b
set -euo pipefail
if [ "$#" -lt 3 ]; then
  echo "usage: $0 RUN_DIR MODEL OUT_DIR [attention options...]" >&2
  exit 2
fi
RUN_DIR=$1 MODEL=$2 OUT_DIR=$3
shift 3
exec python -m sysbench_gpu attention "$RUN_DIR" --model "$MODEL" --out "$OUT_DIR" \
  --device-map auto --layers "${LAYERS:-mid,last}" --dtype "${DTYPE:-bfloat16}" --control "$@"
