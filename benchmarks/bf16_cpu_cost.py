"""What bfloat16 costs against float32 on this CPU: one forward pass and one forward + backward of a checkpoint.

On a CPU with native bfloat16 (AVX512-BF16 or AMX) bf16 matrix products are cheaper than float32's; on one without
(AVX2 only) torch emulates them and they cost several times more. The real zoo evaluates checkpoints in their own
dtype and trains under bf16 autocast by default, so which CPU it runs on decides whether ``--float32`` (``zoo real
pilot``; ``dtype: float32`` of ``evaluate: real``) is worth its different rounding. CPU seconds of the process
(``time.process_time``), one torch thread, random token ids; prints one line per dtype and the CPU's flags.

    python benchmarks/bf16_cpu_cost.py MODEL_FOLDER [--batch 4 --tokens 256]
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

import torch


def cpu_flags() -> list[str]:
    """The CPU's bfloat16-related flags (``/proc/cpuinfo``; empty where there is none or no such file)."""
    path = Path("/proc/cpuinfo")
    text = path.read_text() if path.is_file() else ""
    return sorted(set(re.findall(r"\b(avx512_bf16|amx_bf16|amx_tile|avx512f|avx2)\b", text)))


def cost(model: torch.nn.Module, ids: torch.Tensor) -> tuple[float, float]:
    """CPU seconds of one forward of ``ids`` (after a warm-up) and of one forward + backward of half of it."""
    model.eval()
    with torch.no_grad():
        model(ids)
        started = time.process_time()
        model(ids)
        forward = time.process_time() - started
    model.train()
    half = ids[: max(1, len(ids) // 2), : ids.shape[1] // 2]
    started = time.process_time()
    model(half).logits.float().mean().backward()
    both = time.process_time() - started
    model.zero_grad(set_to_none=True)
    return forward, both


def main() -> None:
    from transformers import AutoModelForCausalLM

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(str(args.model), dtype=torch.float32)
    ids = torch.randint(
        0, model.config.vocab_size, (args.batch, args.tokens), generator=torch.Generator().manual_seed(0)
    )
    print(f"CPU flags: {', '.join(cpu_flags()) or 'none read'}; torch {torch.__version__}")
    rows = {}
    for dtype in (torch.bfloat16, torch.float32):
        rows[dtype] = cost(model.to(dtype), ids)
        fwd, both = rows[dtype]
        print(f"{dtype!s:15} forward {args.batch}x{args.tokens}: {fwd:.2f} CPU s; forward+backward: {both:.2f} CPU s")
    (bf, bfb), (fp, fpb) = rows[torch.bfloat16], rows[torch.float32]
    print(f"bfloat16 / float32: forward {bf / fp:.1f}x, forward+backward {bfb / fpb:.1f}x")


if __name__ == "__main__":
    main()
