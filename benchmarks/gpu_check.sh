#!/usr/bin/env bash
# The GPU checks in one run that fits a GPU lent for minutes: at most 8 minutes on an H200, the most important
# first, each under its own timeout, every result written under $OUT (default artifacts/gpu) as it comes, so a
# run cut short still leaves what it measured. In order:
#   1. the CUDA tests of the engine and of the worker's engine runner (exactness against plain PyTorch and PEFT,
#      bitsandbytes' kernels against the CPU dequantization, budgets, the copy stream);
#   2. spill_overhead on a Llama-style model of about 1B parameters in bf16 (16k tokens a step);
#   3. chunked_head: Llama-3.2-1B's LM head on 16k tokens, whole logits against token chunks;
#   4. memory_bound on Llama-3.2-3B's shape (51 GB of AdamW state) under a 16 GB budget;
#   5. an nf4 LoRA trial on a base of Llama-3.1-8B's widths against fp32 (lora_sharing --base-dtype nf4).
# The timeouts add up to 470 s (each step is killed 5 s after its own), plus a few seconds of setup. Needs torch, transformers, safetensors,
# tokenizers, numpy, psutil, nvidia-ml-py, peft, bitsandbytes, redis-py and pytest in $PYTHON (default python3);
# no Django, Celery or Redis server.
set -uo pipefail
out="${OUT:-artifacts/gpu}"
py="${PYTHON:-python3}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1
start=$(date +%s)

# step NAME SECONDS COMMAND...: run it under its own timeout, its output in $out/NAME.txt as it comes, and a
# line of the outcome in $out/summary.txt.
step() {
  local name="$1" limit="$2"
  shift 2
  local began=$(date +%s)
  timeout --kill-after=5 "$limit" "$@" > "$out/$name.txt" 2>&1
  local rc=$?
  echo "$name rc=$rc $(( $(date +%s) - began ))s (at $(( $(date +%s) - start ))s)" | tee -a "$out/summary.txt"
}

nvidia-smi > "$out/nvidia-smi.txt" 2>&1
df -h /dev/shm /tmp >> "$out/nvidia-smi.txt" 2>&1
"$py" -c 'import torch, transformers, bitsandbytes; print("torch", torch.__version__, "transformers",
transformers.__version__, "bitsandbytes", bitsandbytes.__version__, "cuda", torch.cuda.is_available())' \
  > "$out/versions.txt" 2>&1
# The host tier: /dev/shm when it has room for the largest step's state (the 3B model's 51 GB), else /tmp.
big=/dev/shm
[ "$(df -k --output=avail /dev/shm 2>/dev/null | tail -1)" -gt 60000000 ] 2>/dev/null || big=/tmp

# --confcutdir: only the engine's and the worker's conftests (the repository's root ones set up Django).
step cuda-tests 120 "$py" -m pytest tests/engine/test_cuda.py tests/engine/test_transfer.py \
  tests/engine/test_base_formats.py -m "cuda or not cuda" -q -p no:cacheprovider -p no:django \
  --confcutdir=tests/engine -o addopts="-ra"
step cuda-runner-tests 45 "$py" -m pytest tests/worker/test_cuda_runner.py -m "cuda or not cuda" -q -s \
  -p no:cacheprovider -p no:django --confcutdir=tests/worker -o addopts="-ra"
# About 1B parameters, bf16 compute with fp32 master weights, 16k tokens a step: resident against spilled.
step spill_overhead_llama_1b 75 "$py" benchmarks/spill_overhead.py --model llama-1b --bf16 --device cuda \
  --rounds 1 --steps 2 --spill-dir "$big"
step chunked_head_llama_1b 30 "$py" benchmarks/chunked_head.py --device cuda --bf16 --vocab 128256 --width 2048 \
  --tokens 16384
step memory_bound_llama_3b 100 "$py" benchmarks/memory_bound.py --model llama-3b --bf16 --device cuda --steps 1 \
  --spill-dir "$big"
# One nf4 LoRA trial on a random checkpoint of Llama-3.1-8B's widths and vocabulary with 4 of its 32 blocks (1.9B
# parameters: 3.8 GB in bf16 on disk, a 7.5 GB fp32 base), against the same trial on the fp32 base: the bases'
# host bytes (quantized on the host's CPU) and each trial's time.
step lora_nf4_llama_8b 100 "$py" benchmarks/lora_sharing.py --device cuda --base llama-8b --layers 4 --trials 1 \
  --steps 1 --seq-len 512 --base-dtype nf4 --spill-dir "$big"
echo "done in $(( $(date +%s) - start ))s" | tee -a "$out/summary.txt"
