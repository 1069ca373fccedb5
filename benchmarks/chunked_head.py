"""The LM head's loss with whole logits and in token chunks: peak memory and time, and whether the numbers agree.

One micro-batch's head: hidden states (tokens x width) times a vocabulary x width weight, then the mean
cross-entropy, forward and backward. "Whole" is plain PyTorch (``F.cross_entropy`` on ``F.linear``'s logits, as
``ForCausalLMLoss`` computes it); "chunked" is the engine's (`worker.engine.chunked_loss`), ``--token-chunk``
tokens of logits at a time (default a 32nd of the tokens). Both run in the same process on the same inputs.

Peak activation bytes: the most bytes the allocator held at once during forward + backward, less the weight's
gradient (both runs make one; the whole run makes it last, so this is, if anything, low for the whole run). On
CUDA that is ``torch.cuda.max_memory_allocated`` over what was allocated before; on CPU the running total of the
allocator's allocations and frees as PyTorch's profiler records them (the calling thread's).

Defaults (``--vocab 151936``, Qwen2's vocabulary): width 896 (Qwen2-0.5B's), 2,048 tokens (``--quick``: 256),
fp32 on the CPU.
For a GPU: ``--device cuda --bf16 --vocab 128256 --width 2048 --tokens 16384`` (Llama-3.2-1B's head at 16k
tokens, bf16 autocast as the engine trains it).

The last line is one JSON object: ``{"device", "bf16", "vocab", "width", "tokens", "token_chunk",
"full_logits_bytes", "whole_activation_bytes", "chunked_activation_bytes", "ratio", "whole_s", "chunked_s",
"loss_whole", "loss_chunked", "loss_equal", "grad_hidden_max_diff", "grad_weight_max_diff", "target_met"}``.
``ratio`` is the fp32 full logits' bytes over the chunked run's peak activation bytes. Target: ratio >= 8 with
the same loss (bit-identical on CPU).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.memory_bound import peak_live_bytes
from worker.engine.chunked_loss import IGNORE, chunked_cross_entropy

TARGET = 8.0


def measured(run: Callable[[], torch.Tensor], device: torch.device) -> tuple[torch.Tensor, int, float]:
    """``run()``'s result, the peak bytes it allocated above what was allocated before, and its seconds."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        start = time.perf_counter()
        out = run()
        torch.cuda.synchronize(device)
        return out, torch.cuda.max_memory_allocated(device) - before, time.perf_counter() - start
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as profiler:
        start = time.perf_counter()
        out = run()
        seconds = time.perf_counter() - start
    return out, peak_live_bytes(profiler), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--width", type=int, default=896)
    parser.add_argument("--tokens", type=int, help="tokens of the micro-batch (default 2048; quick 256)")
    parser.add_argument("--quick", action="store_true", help="256 tokens: seconds on 2 CPU cores")
    parser.add_argument("--token-chunk", type=int, default=None, help="tokens of logits at once (default tokens/32)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast, as the engine's bf16 trials")
    args = parser.parse_args()
    args.tokens = args.tokens or (256 if args.quick else 2048)
    device = torch.device(args.device)
    chunk = args.token_chunk or max(16, args.tokens // 32)
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(args.tokens, args.width, generator=generator).to(device)
    weight = (torch.randn(args.vocab, args.width, generator=generator) * args.width ** -0.5).to(device)
    targets = torch.randint(0, args.vocab, (args.tokens,), generator=generator)
    targets[::16] = IGNORE  # a row's last position predicts nothing
    targets = targets.to(device)

    def run(chunked: bool) -> list[torch.Tensor]:
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()

        def step() -> torch.Tensor:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16):
                if chunked:
                    loss = chunked_cross_entropy(h, w, targets, token_chunk=chunk)
                else:
                    loss = F.cross_entropy(F.linear(h, w).float(), targets, ignore_index=IGNORE)
            loss.backward()
            return loss.detach()

        loss, peak, seconds = measured(step, device)
        return [loss, h.grad, w.grad, torch.tensor(peak - w.numel() * w.element_size()), torch.tensor(seconds)]

    whole = run(chunked=False)
    chunked = run(chunked=True)
    full_logits = args.tokens * args.vocab * 4
    ratio = full_logits / max(1, int(chunked[3]))
    loss_equal = bool(torch.equal(whole[0], chunked[0]))
    result = {
        "device": str(device), "bf16": args.bf16, "vocab": args.vocab, "width": args.width, "tokens": args.tokens,
        "token_chunk": chunk, "full_logits_bytes": full_logits,
        "whole_activation_bytes": int(whole[3]), "chunked_activation_bytes": int(chunked[3]),
        "ratio": round(ratio, 2), "whole_s": round(float(whole[4]), 3), "chunked_s": round(float(chunked[4]), 3),
        "loss_whole": whole[0].item(), "loss_chunked": chunked[0].item(), "loss_equal": loss_equal,
        "grad_hidden_max_diff": (whole[1] - chunked[1]).abs().max().item(),
        "grad_weight_max_diff": (whole[2] - chunked[2]).abs().max().item(),
    }
    same = loss_equal if device.type == "cpu" else abs(result["loss_whole"] - result["loss_chunked"]) <= 1e-3
    result["target_met"] = ratio >= TARGET and same
    print(json.dumps(result))


if __name__ == "__main__":
    main()
