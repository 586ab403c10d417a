"""A merge on the real zoo base as GGUF, written as GGUF, run by llama.cpp (needs llama-cpp-python).

    python benchmarks/gguf_check.py BASE.gguf --work /tmp/gguf-bench        # first: makes WORK/safetensors-bf16
    python benchmarks/gguf_merge_real.py BASE.gguf --bf16 /tmp/gguf-bench/safetensors-bf16 --work /tmp/gguf-real

Two stand-in agents are the bf16 copy of the base with N(0, (2e-3)²) added (seeds 1, 2). They are merged with
TIES against the GGUF base itself (``--base BASE.gguf``), ``--dtype bfloat16 --gguf Q8_0``; then the greedy
continuation of a chat prompt by llama.cpp on ``model-Q8_0.gguf`` is compared with transformers' on the merged
safetensors folder and on the same GGUF file. Prints the merge summary (with its quantization note) and the
three continuations.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import torch
import transformers

TOKENS = 32


def agents(bf16: Path, work: Path) -> list[Path]:
    out = []
    for seed in (1, 2):
        folder = work / f"a{seed}"
        if not folder.exists():
            model = transformers.AutoModelForCausalLM.from_pretrained(bf16, dtype=torch.float32)
            gen = torch.Generator().manual_seed(seed)
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn(p.shape, generator=gen) * 2e-3)
            model.to(torch.bfloat16).save_pretrained(folder)
            transformers.AutoTokenizer.from_pretrained(bf16).save_pretrained(folder)
        out.append(folder)
    return out


def first_equal(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base", type=Path)
    ap.add_argument("--bf16", type=Path, required=True, help="the base as a bf16 safetensors folder")
    ap.add_argument("--work", type=Path, required=True)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    a1, a2 = agents(args.bf16, args.work)
    out = args.work / "m"
    flags = ["--method", "ties", "--base", str(args.base), "--model", str(a1), "--model", str(a2)]
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "agentmerge", "merge", str(out), *flags, "--gguf", "Q8_0", "--dtype", "bfloat16"]
    done = subprocess.run([*cmd, "--force"], capture_output=True, text=True, check=True)
    print(f"merge: {time.perf_counter() - t0:.0f} s")
    print("\n".join(line for line in done.stderr.splitlines() if "/s]" not in line and line.strip()))

    import llama_cpp

    tok = transformers.AutoTokenizer.from_pretrained(out)
    messages = [{"role": "user", "content": "What is a task vector?"}]
    prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tok(prompt)["input_ids"]
    llm = llama_cpp.Llama(model_path=str(out / "model-Q8_0.gguf"), n_ctx=512, n_threads=2, verbose=False, seed=0)
    print(
        "llama.cpp tokenizes the prompt as transformers:",
        llm.tokenize(prompt.encode(), add_bos=False, special=True) == ids,
    )
    got = []
    for token in llm.generate(ids, top_k=1, temp=0.0, repeat_penalty=1.0):
        got.append(int(token))
        if len(got) == TOKENS:
            break
    print(f"llama.cpp on model-Q8_0.gguf: {tok.decode(got)!r}")
    for label, extra in (("the merged safetensors", {}), ("model-Q8_0.gguf", {"gguf_file": "model-Q8_0.gguf"})):
        model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, **extra)
        with torch.no_grad():
            want = model.generate(torch.tensor([ids]), max_new_tokens=TOKENS, do_sample=False)[0, len(ids) :]
        print(f"transformers on {label}: {tok.decode(want)!r}")
        print(f"  first {first_equal(got, want.tolist())} of {TOKENS} greedy tokens equal to llama.cpp's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
