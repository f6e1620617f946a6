#!/usr/bin/env bash
# Qwen2-72B-Instruct on one node with 4 x H100 80GB: vLLM tensor parallel 4, all 500 sessions.
#
# Memory: bf16 weights are ~145 GB, ~36 GB per GPU. With GPU_MEM=0.90 each GPU gives vLLM
# ~72 GB, leaving ~30 GB per GPU for the KV cache (~80 KiB per token per GPU under TP 4:
# 80 layers x 2 of the 8 KV heads x 128 dims x K and V x 2 bytes), i.e. a few hundred
# thousand cached tokens: the whole turn of 500 sessions fits, and prefix caching keeps
# each session's history between turns.
#
# Resume: run the same command again with the same OUT; finished turns are skipped and a
# session continues from its stored replies. Killing it loses at most the turn in flight.
set -euo pipefail

MODEL="${MODEL:-Qwen/Qwen2-72B-Instruct}"         # hub id (already downloaded) or a local folder
DATA="${DATA:-system_benchmark_eval_datas.json}"   # upstream's file, downloaded by you
OUT="${OUT:-runs/qwen2-72b-instruct}"
GPUS="${GPUS:-0,1,2,3}"                            # four GPUs of this node
TP=4
GPU_MEM="${GPU_MEM:-0.90}"                         # fraction of each GPU vLLM may take
MAX_MODEL_LEN="${MAX_MODEL_LEN:-16384}"            # SysBench prompts stay far below this

export CUDA_VISIBLE_DEVICES="$GPUS"

# Default sampling is the model's generation_config.json (the paper kept the defaults);
# add --temperature/--top-p/--max-tokens/--seed to override, all recorded in the manifest.
sysbench-gpu generate \
  --data "$DATA" \
  --model "$MODEL" \
  --engine vllm \
  --out "$OUT" \
  --history model \
  --tensor-parallel-size "$TP" \
  --gpu-memory-utilization "$GPU_MEM" \
  --max-model-len "$MAX_MODEL_LEN" \
  --dtype bfloat16

# Then judge and score (GPT-4o as the paper's verifier; the key is read from the environment):
# export OPENAI_API_KEY=...
# sysbench-gpu judge "$OUT" --judge openai --judge-model gpt-4o --concurrency 16
# sysbench-gpu metrics "$OUT"
