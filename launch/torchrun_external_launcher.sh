#!/usr/bin/env bash
# torchrun starts 4 ranks; each builds the same vLLM engine through vLLM's external
# launcher backend (tensor parallel 4 across the ranks) and runs the same batches.
# Only rank 0 (RANK=0) writes the run directory; the other ranks compute and discard.
#
# Use it where a cluster scheduler already starts one process per GPU through torchrun
# (or Slurm + torchrun); otherwise the plain launch in qwen2_72b_tp4.sh is simpler.
# Rules of the external launcher: --nproc-per-node must equal TP x PP, every rank needs
# the same inputs and seed (the sampling seed is passed to every rank), and all ranks run
# on one node here (the run directory is read back by every rank on resume).
#
# Memory: as qwen2_72b_tp4.sh (the same model and layout).
# Resume: rerun the same command with the same OUT.
set -euo pipefail

MODEL="${MODEL:-Qwen/Qwen2-72B-Instruct}"
DATA="${DATA:-system_benchmark_eval_datas.json}"
OUT="${OUT:-runs/qwen2-72b-instruct-torchrun}"
NPROC=4                                           # = tensor parallel size (x pipeline size)
MASTER_PORT="${MASTER_PORT:-29500}"
GPU_MEM="${GPU_MEM:-0.90}"
SEED="${SEED:-0}"                                 # the same on every rank

export CUDA_VISIBLE_DEVICES="${GPUS:-0,1,2,3}"

torchrun --nproc-per-node "$NPROC" --master-port "$MASTER_PORT" \
  -m sysbench_gpu generate \
  --data "$DATA" \
  --model "$MODEL" \
  --engine vllm \
  --out "$OUT" \
  --tensor-parallel-size "$NPROC" \
  --distributed-executor-backend external_launcher \
  --gpu-memory-utilization "$GPU_MEM" \
  --seed "$SEED" \
  --dtype bfloat16

# sysbench-gpu judge "$OUT" --judge openai --judge-model gpt-4o --concurrency 16
# sysbench-gpu metrics "$OUT"
