#!/usr/bin/env bash
# The GPU checks in one short run, for a machine with a CUDA GPU: the CUDA tests of the engine and of the
# worker's engine runner, then spill_overhead and memory_bound on the GPU (GPT-2's shape, then Llama-3.2-1B's LM
# head on 16k tokens with whole logits and in token chunks (chunked_head), then a Llama-style
# model of about 1B parameters in bf16 at 16k tokens per step, and the largest Llama-style model whose AdamW
# state fits the host, Llama-3.2-3B's shape, under a 16 GB budget), then 8 LoRA trials sharing one frozen
# base of Llama-3.1-8B's shape under a 16 GB budget (lora_sharing). Everything lands under $OUT
# (default artifacts/gpu). Needs torch, transformers, safetensors, tokenizers, numpy, psutil, nvidia-ml-py,
# redis-py and pytest in $PYTHON (default python3); no Django, Celery or Redis server. Each step runs under
# a timeout, so the whole run ends within 39 minutes; the Llama cases come last.
set -uo pipefail
out="${OUT:-artifacts/gpu}"
py="${PYTHON:-python3}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

nvidia-smi > "$out/nvidia-smi.txt" 2>&1
df -h /dev/shm /tmp >> "$out/nvidia-smi.txt" 2>&1
# The host tier is /dev/shm where it is large enough for spill_overhead's stores (a few GB), else /tmp.
shm=/dev/shm
[ "$(df -k --output=avail /dev/shm 2>/dev/null | tail -1)" -gt 8000000 ] 2>/dev/null || shm=/tmp
"$py" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__,
"cuda", torch.cuda.is_available())' 2>&1 | tee "$out/versions.txt"
# --confcutdir: only the engine's conftest (the repository's root ones set up Django for the web tests).
timeout 240 "$py" -m pytest tests/engine/test_cuda.py tests/engine/test_transfer.py -m "cuda or not cuda" -q \
  -p no:cacheprovider -p no:django --confcutdir=tests/engine -o addopts="-ra" 2>&1 | tee "$out/cuda-tests.txt"
timeout 240 "$py" -m pytest tests/worker/test_cuda_runner.py -m "cuda or not cuda" -q -s \
  -p no:cacheprovider -p no:django --confcutdir=tests/worker -o addopts="-ra" 2>&1 | tee -a "$out/cuda-tests.txt"
timeout 240 "$py" benchmarks/spill_overhead.py --device cuda --rounds 1 --steps 3 --spill-dir "$shm" 2>&1 | tee "$out/spill_overhead.txt"
timeout 150 "$py" benchmarks/memory_bound.py --quick --device cuda 2>&1 | tee "$out/memory_bound.txt"
# Llama-3.2-1B's LM head (128,256 x 2,048) on 16k tokens in bf16: whole logits against the token-chunked loss
# (peak activation bytes and time of each, and how closely the loss and gradients agree on the GPU).
timeout 180 "$py" benchmarks/chunked_head.py --device cuda --bf16 --vocab 128256 --width 2048 --tokens 16384 \
  2>&1 | tee "$out/chunked_head_llama_1b.txt"
# A Llama-style model of about 1B parameters, bf16 compute with fp32 master weights, 16k tokens per step.
timeout 300 "$py" benchmarks/spill_overhead.py --model llama-1b --bf16 --device cuda --rounds 1 --steps 3 \
  --spill-dir "$shm" 2>&1 | tee "$out/spill_overhead_llama_1b.txt"
# Llama-3.2-3B's shape: 51 GB of AdamW state, spilled to /dev/shm when it has room for it, else to disk.
big=/dev/shm
[ "$(df -k --output=avail /dev/shm 2>/dev/null | tail -1)" -gt 60000000 ] 2>/dev/null || big=/tmp
timeout 420 "$py" benchmarks/memory_bound.py --model llama-3b --bf16 --device cuda --steps 2 --spill-dir "$big" \
  2>&1 | tee "$out/memory_bound_llama_3b.txt"
# 8 LoRA trials on one shared base of Llama-3.1-8B's shape (a random bf16 checkpoint of 16 GB, a 32 GB fp32 base
# on the host tier), interleaved on the GPU; the one-at-a-time baseline trains one trial alone and scales.
timeout 420 "$py" benchmarks/lora_sharing.py --device cuda --base llama-8b --trials 8 --steps 1 --seq-len 512 \
  --sequential-trials 1 --spill-dir "$big" 2>&1 | tee "$out/lora_sharing_llama_8b.txt"
