"""Memory and time of reading trainer checkpoints: ``agentmerge convert`` of a verl folder and of a DCP folder.

    python benchmarks/trainer_inputs.py [--work bench-work/trainer] [--layers 8] [--world 4]

Writes a seeded synthetic Llama-layout fp32 state dict (hidden 1024, vocab 32000, ``--layers`` layers) as
verl rank files (plain dim-0 pieces, ``--world`` ranks) and as a DCP folder, then runs ``agentmerge convert
SRC DST --dtype bf16`` on each as a whole process and samples its peak anonymous memory (RssAnon, what the
process itself allocated; the memory-mapped rank files are page cache, not counted) and peak RSS from /proc.
Prints one markdown table.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch


def state_dict(layers: int, hidden: int = 1024, vocab: int = 32000, inter: int = 2816) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    shapes = {
        "model.embed_tokens.weight": (vocab, hidden),
        "model.norm.weight": (hidden,),
        "lm_head.weight": (vocab, hidden),
    }
    for i in range(layers):
        p = f"model.layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            shapes[f"{p}self_attn.{name}.weight"] = (hidden, hidden)
        shapes[f"{p}mlp.gate_proj.weight"] = (inter, hidden)
        shapes[f"{p}mlp.up_proj.weight"] = (inter, hidden)
        shapes[f"{p}mlp.down_proj.weight"] = (hidden, inter)
        shapes[f"{p}input_layernorm.weight"] = (hidden,)
        shapes[f"{p}post_attention_layernorm.weight"] = (hidden,)
    return {k: torch.randn(s, generator=gen) * 0.02 for k, s in shapes.items()}


def config(layers: int) -> dict[str, object]:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 1024, "intermediate_size": 2816,
        "num_hidden_layers": layers, "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 32000,
        "torch_dtype": "bfloat16", "tie_word_embeddings": False,
    }  # fmt: skip


def write_inputs(work: Path, layers: int, world: int) -> tuple[Path, Path, int]:
    sd = state_dict(layers)
    nbytes = sum(t.numel() * 4 for t in sd.values())
    actor = work / "verl" / "actor"
    if not actor.exists():
        (actor / "huggingface").mkdir(parents=True)
        (actor / "huggingface" / "config.json").write_text(json.dumps(config(layers)))
        for r in range(world):
            shard = {k: (v.chunk(world, 0)[r].clone() if v.dim() else v) for k, v in sd.items()}
            torch.save(shard, actor / f"model_world_size_{world}_rank_{r}.pt")
    dcp_dir = work / "dcp"
    if not dcp_dir.exists():
        import torch.distributed.checkpoint as dcp

        dcp.save({"model": sd}, checkpoint_id=dcp_dir, no_dist=True)
        (dcp_dir / "huggingface").mkdir()
        (dcp_dir / "huggingface" / "config.json").write_text(json.dumps(config(layers)))
    return actor.parent, dcp_dir, nbytes


def peak_memory(cmd: list[str]) -> tuple[float, int, int]:
    """``(seconds, peak RssAnon bytes, peak RSS bytes)`` of ``cmd``, sampled every 20 ms."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd)
    peaks = {"RssAnon": 0, "VmRSS": 0}

    def sample() -> None:
        while proc.poll() is None:
            try:
                for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                    key, _, value = line.partition(":")
                    if key in peaks:
                        peaks[key] = max(peaks[key], int(value.split()[0]) * 1024)
            except OSError:
                pass
            time.sleep(0.02)

    thread = threading.Thread(target=sample)
    thread.start()
    if proc.wait() != 0:
        raise SystemExit(f"{' '.join(cmd)} failed")
    thread.join()
    return time.perf_counter() - t0, peaks["RssAnon"], peaks["VmRSS"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="bench-work/trainer")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--world", type=int, default=4)
    args = ap.parse_args()
    work = Path(args.work)
    verl, dcp_dir, nbytes = write_inputs(work, args.layers, args.world)
    print(f"model: {nbytes / 1e6:.0f} MB of fp32 weights; {args.world} verl rank files\n")
    print("| input | convert --dtype bf16 wall s | peak RssAnon MB | peak RSS MB |\n|---|---|---|---|")
    seconds, anon, rss = peak_memory(
        [sys.executable, "-c", "import agentmerge.engine.convert, agentmerge.io.formats.open"]
    )
    print(f"| (imports only) | {seconds:.1f} | {anon / 1e6:.0f} | {rss / 1e6:.0f} |")
    for label, src in (("verl", verl), ("dcp", dcp_dir), ("safetensors (the verl output)", work / "out-verl")):
        out = work / f"out-{label.split()[0]}-2" if label.startswith("safetensors") else work / f"out-{label}"
        shutil.rmtree(out, ignore_errors=True)
        cmd = [sys.executable, "-m", "agentmerge", "convert", str(src), str(out), "--dtype", "bf16"]
        seconds, anon, rss = peak_memory(cmd)
        print(f"| {label} | {seconds:.1f} | {anon / 1e6:.0f} | {rss / 1e6:.0f} |")


if __name__ == "__main__":
    main()
