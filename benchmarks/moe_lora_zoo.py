"""The agents as a mixture of experts, and the best merge as LoRA adapters, measured on the char zoo.

    PYTHONPATH=src:zoo/src python benchmarks/moe_lora_zoo.py --zoo .zoo-cache --seeds 0,1,2 --work moe-work \
        [--n-test 1000] [--n-val 300] [--lambdas 0.5,1,1.5,2,2.5,3] [--threads 1] [--docs docs/moe-lora]

Needs the built zoo (``agentmerge zoo build --out ZOO --seed S`` for each seed; the core zoo's bf16 agents).
Per seed, everything cached under ``--work`` (evaluations keyed by the weights' digest, as ``zoo bench`` does):

1. the base and the three specialists (code, tool, memory) on the test split;
2. static merges: ``ram``, and task arithmetic with lambda tuned on the validation split's agentic average (the
   best static merge of docs/results.md in every regime);
3. ``agentmerge moe`` (Mixtral; router from 32 training-stream prompts of each agent's domain, never a
   validation or test prompt) with attention from the tuned task arithmetic merge and from RAM, top-1 and top-2,
   and once (tuned TA, top-1) with the router made from the same prompts followed by their correct answers;
   routing accuracy: the share of each domain's test prompt tokens whose top-1 expert is that domain's agent
   (first MoE layer and mean over layers), and where the held-out ``reverse`` prompts go;
4. ``agentmerge extract-lora`` of the tuned task arithmetic merge at rank 4, 16, 64 and energy 0.9 (bf16
   factors, embeddings and norms saved whole), applied to the base (``BASE+ADAPTER``) and scored; sizes.

Writes ``WORK/results.json`` and, with ``--docs``, ``DOCS/results.md`` and ``DOCS/results.json``: mean +- SE over
seeds of every score, paired differences against the best static merge.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from itertools import islice
from pathlib import Path
from typing import Any

import torch

from agentmerge.config.schema import MergeConfig, ModelSpec
from agentmerge.engine.convert import convert
from agentmerge.engine.extract_lora import extract_lora
from agentmerge.engine.merge import merge
from agentmerge.engine.moe.build import build_moe
from agentmerge.engine.moe.moe_config import moe_config_from_dict
from agentmerge_zoo.evaluate import agentic_average, evaluate_cached
from agentmerge_zoo.splits import eval_set, held_out_prompts, train_stream
from agentmerge_zoo.tasks import CORE_DOMAINS, all_tasks, metric_domain

ROUTER_PROMPTS = 32
ROUTING_PROMPTS = 200  # test prompts per task for the routing accuracy
LORA = (("rank4", {"rank": 4}), ("rank16", {"rank": 16}), ("rank64", {"rank": 64}), ("energy0.9", {"energy": 0.9}))


def domain_scores(metrics: dict[str, float]) -> dict[str, float]:
    """Mean of each domain's metrics, the agentic average (trained domains) and the held-out score."""
    by: dict[str, list[float]] = {}
    for name, value in metrics.items():
        by.setdefault(metric_domain(name), []).append(value)
    out = {d: statistics.mean(v) for d, v in by.items()}
    out["agentic"] = agentic_average(metrics)
    return out


class Seed:
    """One seed's checkpoints, merges, MoEs and adapters, all cached under ``work/seed{S}``."""

    def __init__(self, zoo: Path, seed: int, work: Path, args: argparse.Namespace) -> None:
        self.zoo, self.seed, self.args = zoo / f"seed{seed}", seed, args
        self.work = work / f"seed{seed}"
        self.work.mkdir(parents=True, exist_ok=True)
        self.base = self.zoo / "base"
        self.agents = {d: self.zoo / f"agent_{d}" for d in CORE_DOMAINS}

    def score(self, folder: Path, split: str = "test") -> dict[str, float]:
        n = self.args.n_test if split == "test" else self.args.n_val
        report, _ = evaluate_cached(folder, split=split, n=n, tasks=None, batch_size=250, cache=self.work / "evals")
        return report.metrics

    def merged(self, name: str, method: str, params: dict[str, Any]) -> Path:
        out = self.work / name
        if not (out / "merge.json").exists():
            models = [ModelSpec(path=str(p)) for p in self.agents.values()]
            merge(MergeConfig(method=method, base=str(self.base), models=models, params=params), out, quiet=True)
        return out

    def best_ta(self) -> tuple[Path, float]:
        """Task arithmetic with lambda chosen on the validation split's agentic average."""
        best: tuple[float, float, Path] | None = None
        for lam in self.args.lambdas:
            folder = self.merged(f"ta_lambda{lam:g}", "task_arithmetic", {"lambda": lam})
            value = agentic_average(self.score(folder, "val"))
            if best is None or value > best[0]:
                best = (value, lam, folder)
        assert best is not None
        return best[2], best[1]

    def router_prompts(self, answers: bool) -> list[list[str]]:
        """32 training-stream examples per domain: the prompts, or the prompts with their correct answers."""
        exclude = held_out_prompts(self.args.n_val, self.args.n_test)
        return [
            [
                ex.prompt + (ex.answer if answers else "")
                for ex in islice(train_stream({d: 1.0}, self.seed, "moe-router", exclude), ROUTER_PROMPTS)
            ]
            for d in CORE_DOMAINS
        ]

    def moe(self, name: str, static: Path | None, k: int) -> Path:
        out = self.work / name
        if not (out / "merge.json").exists():
            experts = [
                {"path": str(self.agents[d]), "prompts": p}
                for d, p in zip(CORE_DOMAINS, self.router_prompts(name.endswith("answers")), strict=True)
            ]
            data = {"base": str(self.base), "experts": experts, "experts_per_token": k}
            build_moe(moe_config_from_dict(data | ({"static": str(static)} if static else {})), out)
        return out

    def lora(self, merged: Path, name: str, options: dict[str, Any]) -> tuple[Path, int]:
        adapter, applied = self.work / f"lora-{name}", self.work / f"lora-{name}-model"
        if not (adapter / "adapter_config.json").exists():
            extract_lora(merged, self.base, adapter, dtype="bfloat16", **options)
        if not (applied / "config.json").exists():
            convert(f"{self.base}+{adapter}", applied, dtype="bf16")
        return applied, (adapter / "adapter_model.safetensors").stat().st_size

    def lora_ranks(self, name: str) -> dict[str, float]:
        """Median, min and max rank over the adapter's modules and the median relative error (extraction.json)."""
        modules = json.loads((self.work / f"lora-{name}" / "extraction.json").read_text())["modules"]
        ranks = [m["rank"] for m in modules]
        errors = [m["error_stored"] for m in modules]
        return {
            "median": statistics.median(ranks),
            "min": min(ranks),
            "max": max(ranks),
            "error": statistics.median(errors),
        }


def routing(folder: Path, prompts_per_task: int) -> dict[str, dict[str, list[list[float]]]]:
    """Per task, for its test prompts' tokens and for the reference answers' tokens (teacher-forced after the
    prompt): ``[layer][expert]``, the share whose top-1 expert is that expert."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    out = {}
    for name, task in all_tasks().items():
        counts: dict[str, Any] = {"prompt": 0, "answer": 0}
        for ex in eval_set(task, "test", prompts_per_task):
            cut = len(tok(ex.prompt)["input_ids"])
            with torch.no_grad():
                ids = tok(ex.prompt + ex.answer, return_tensors="pt")
                logits = model(**ids, output_router_logits=True).router_logits
            for part, rows in (("prompt", slice(0, cut)), ("answer", slice(cut, None))):
                top = [torch.bincount(g[rows].argmax(-1), minlength=g.shape[-1]) for g in logits]
                counts[part] = counts[part] + torch.stack(top).float()
        out[name] = {part: (c / c.sum(-1, keepdim=True)).tolist() for part, c in counts.items()}
    return out


def run_seed(s: Seed) -> dict[str, Any]:
    """Every score of one seed (module docstring)."""
    scores: dict[str, dict[str, float]] = {"base": domain_scores(s.score(s.base))}
    for d, folder in s.agents.items():
        scores[f"specialist_{d}"] = domain_scores(s.score(folder))
    best, lam = s.best_ta()
    scores["ta_tuned"] = domain_scores(s.score(best))
    scores["ram"] = domain_scores(s.score(s.merged("ram", "ram", {})))
    moes = {
        "moe_ta_top1": (best, 1),
        "moe_ta_top2": (best, 2),
        "moe_ta_top1_answers": (best, 1),
        "moe_ram_top1": (None, 1),
        "moe_ram_top2": (None, 2),
    }
    route = {}
    for name, (static, k) in moes.items():
        folder = s.moe(name, static, k)
        scores[name] = domain_scores(s.score(folder))
        route[name] = routing(folder, ROUTING_PROMPTS)
    sizes = {"ta_tuned": (best / "model.safetensors").stat().st_size}
    ranks = {}
    for name, options in LORA:
        applied, sizes[f"lora_{name}"] = s.lora(best, name, options)
        scores[f"lora_{name}"] = domain_scores(s.score(applied))
        ranks[f"lora_{name}"] = s.lora_ranks(name)
    return {"seed": s.seed, "ta_lambda": lam, "scores": scores, "routing": route, "bytes": sizes, "ranks": ranks}


def mean_se(values: list[float]) -> tuple[float, float]:
    mean = statistics.mean(values)
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return mean, se


def pm(values: list[float], scale: float = 100.0) -> str:
    mean, se = mean_se([v * scale for v in values])
    return f"{mean:.1f} ± {se:.1f}"


ROWS = (
    "base",
    "ta_tuned",
    "ram",
    "moe_ta_top1",
    "moe_ta_top2",
    "moe_ta_top1_answers",
    "moe_ram_top1",
    "moe_ram_top2",
)
LABELS = {
    "base": "base",
    "ta_tuned": "task arithmetic, λ tuned (best static merge)",
    "ram": "RAM",
    "moe_ta_top1": "MoE, attention from tuned TA, top-1",
    "moe_ta_top2": "MoE, attention from tuned TA, top-2",
    "moe_ta_top1_answers": "MoE, tuned TA, top-1, router from prompts with answers",
    "moe_ram_top1": "MoE, attention from RAM, top-1",
    "moe_ram_top2": "MoE, attention from RAM, top-2",
}


def score_table(runs: list[dict[str, Any]]) -> list[str]:
    """Domain scores, agentic average and held-out per checkpoint; the specialists on their own domains."""
    cols = (*CORE_DOMAINS, "agentic", "heldout")
    lines = [
        "| checkpoint | " + " | ".join(cols) + " | agentic − best static (paired) |",
        "|" + "---|" * (len(cols) + 2),
    ]
    for row in ROWS:
        cells = [pm([r["scores"][row][c] for r in runs]) for c in cols]
        diff = pm([r["scores"][row]["agentic"] - r["scores"]["ta_tuned"]["agentic"] for r in runs])
        lines.append(f"| {LABELS[row]} | " + " | ".join(cells) + f" | {diff} |")
    own = [[r["scores"][f"specialist_{d}"][d] for r in runs] for d in CORE_DOMAINS]
    agentic = [statistics.mean(x) for x in zip(*own, strict=True)]
    diff = pm([a - r["scores"]["ta_tuned"]["agentic"] for a, r in zip(agentic, runs, strict=True)])
    lines.append(
        "| each specialist on its own domain | "
        + " | ".join([*(pm(o) for o in own), pm(agentic), "–"])
        + f" | {diff} |"
    )
    return lines


def kept_table(runs: list[dict[str, Any]]) -> list[str]:
    """Per domain: the share of its specialist's gain over the base that a checkpoint keeps there, and the paired
    difference of the domain score against the best static merge."""
    lines = [
        "| checkpoint | " + " | ".join(f"{d}: gain kept | {d}: − best static" for d in CORE_DOMAINS) + " |",
        "|" + "---|" * (2 * len(CORE_DOMAINS) + 1),
    ]
    for row in ROWS[1:]:
        cells = []
        for d in CORE_DOMAINS:
            kept = [
                (r["scores"][row][d] - r["scores"]["base"][d])
                / (r["scores"][f"specialist_{d}"][d] - r["scores"]["base"][d])
                for r in runs
            ]
            diff = [r["scores"][row][d] - r["scores"]["ta_tuned"][d] for r in runs]
            cells += [f"{pm(kept, 100)} %", pm(diff)]
        lines.append(f"| {LABELS[row]} | " + " | ".join(cells) + " |")
    return lines


def routing_table(runs: list[dict[str, Any]], part: str) -> list[str]:
    """Share of each domain's test tokens whose top-1 expert is its own agent: first layer / mean over layers."""
    experts = {"code": 0, "tool": 1, "mem_short": 2, "mem_long": 2}
    lines = [
        "| MoE | "
        + " | ".join(f"{t} → its agent" for t in experts)
        + " | reverse → code / tool / memory (first layer) |",
        "|" + "---|" * (len(experts) + 2),
    ]
    for name in (r for r in ROWS if r.startswith("moe")):
        cells = []
        for task, e in experts.items():
            first = [r["routing"][name][task][part][0][e] for r in runs]
            mean = [statistics.mean(layer[e] for layer in r["routing"][name][task][part]) for r in runs]
            cells.append(f"{pm(first)} / {pm(mean)}")
        reverse = " / ".join(pm([r["routing"][name]["reverse"][part][0][e] for r in runs]) for e in range(3))
        lines.append(f"| {LABELS[name]} | " + " | ".join(cells) + f" | {reverse} |")
    return lines


def lora_table(runs: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| model | ranks: median (min-max) | relative error, median module | agentic | − full merge (paired) | "
        "held-out | weights MB | share of the merge's size |",
        "|---|---|---|---|---|---|---|---|",
    ]
    full = [r["bytes"]["ta_tuned"] for r in runs]
    agentic, heldout = (pm([r["scores"]["ta_tuned"][c] for r in runs]) for c in ("agentic", "heldout"))
    lines.append(
        f"| tuned TA merge (bf16) | – | – | {agentic} | – | {heldout} | {statistics.mean(full) / 1e6:.2f} | 100 % |"
    )
    for name, _ in LORA:
        key = f"lora_{name}"
        diff = pm([r["scores"][key]["agentic"] - r["scores"]["ta_tuned"]["agentic"] for r in runs])
        size = statistics.mean(r["bytes"][key] for r in runs)
        ranks = [r["ranks"][key] for r in runs]
        spread = f"{statistics.mean(x['median'] for x in ranks):.0f} ({min(x['min'] for x in ranks)}-{max(x['max'] for x in ranks)})"
        error = f"{statistics.mean(x['error'] for x in ranks):.3f}"
        agentic, heldout = (pm([r["scores"][key][c] for r in runs]) for c in ("agentic", "heldout"))
        lines.append(
            f"| LoRA {name} | {spread} | {error} | {agentic} | {diff} | {heldout} | {size / 1e6:.2f} | "
            f"{100 * size / statistics.mean(full):.0f} % |"
        )
    return lines


def markdown(runs: list[dict[str, Any]], command: str) -> str:
    seeds = ", ".join(str(r["seed"]) for r in runs)
    lams = ", ".join(f"{r['ta_lambda']:g}" for r in runs)
    return "\n".join(
        [
            "# MoE of the agents and LoRA of the best merge on the char zoo",
            "",
            f"Seeds {seeds} (bf16 zoo), test split, mean ± SE over seeds, points. Task arithmetic's λ chosen on "
            f"validation: {lams}. Made with:",
            "",
            f"```bash\n{command}\n```",
            "",
            "## Scores",
            "",
            *score_table(runs),
            "",
            "Share of each specialist's gain over the base kept on its own domain, and the domain score's paired "
            "difference against the best static merge (points):",
            "",
            *kept_table(runs),
            "",
            "## Routing: where each domain's test prompts go",
            "",
            "Share of the tokens (200 test prompts per task) whose top-1 expert is the domain's agent, first "
            "MoE layer / mean over layers. Prompt tokens:",
            "",
            *routing_table(runs, "prompt"),
            "",
            "The reference answer's tokens, teacher-forced after the prompt (what the model generates):",
            "",
            *routing_table(runs, "answer"),
            "",
            "## The best merge as LoRA adapters (base + adapter)",
            "",
            *lora_table(runs),
            "",
        ]
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--zoo", type=Path, default=Path(".zoo-cache"))
    p.add_argument("--seeds", default="0")
    p.add_argument("--work", type=Path, default=Path("moe-work"))
    p.add_argument("--n-test", type=int, default=1000)
    p.add_argument("--n-val", type=int, default=300)
    p.add_argument("--lambdas", default="0.5,1,1.5,2,2.5,3")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--docs", type=Path)
    args = p.parse_args()
    args.lambdas = [float(x) for x in args.lambdas.split(",")]
    torch.set_num_threads(args.threads)
    runs = []
    for seed in (int(s) for s in args.seeds.split(",")):
        cached = args.work / f"seed{seed}" / "result.json"
        if not cached.exists():
            cached.parent.mkdir(parents=True, exist_ok=True)
            cached.write_text(json.dumps(run_seed(Seed(args.zoo, seed, args.work, args)), indent=1) + "\n")
        runs.append(json.loads(cached.read_text()))
        print(f"seed {seed} done", flush=True)
    (args.work / "results.json").write_text(json.dumps(runs, indent=1) + "\n")
    command = (
        f"PYTHONPATH=src:zoo/src python benchmarks/moe_lora_zoo.py --zoo {args.zoo} --seeds {args.seeds} --work {args.work} "
        f"--n-test {args.n_test} --n-val {args.n_val} --lambdas {','.join(f'{x:g}' for x in args.lambdas)}"
    )
    text = markdown(runs, command)
    print(text)
    if args.docs:
        args.docs.mkdir(parents=True, exist_ok=True)
        (args.docs / "results.md").write_text(text)
        (args.docs / "results.json").write_text(json.dumps(runs, indent=1) + "\n")


if __name__ == "__main__":
    main()
