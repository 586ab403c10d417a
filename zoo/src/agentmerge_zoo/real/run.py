"""One seed of the real zoo, stage by stage, each stage skipped when its output exists (so a rerun resumes).

``WORK/seedS/``: ``agent_SKILL/`` for each skill of the lineup (``train``; ``agent_{tool,code,memory}``
by default), ``check.json`` (the base and the agents on test, the
convergence check on validation, the probe and the drift), ``fisher/`` (each agent's diagonal Fisher),
``val/`` and ``test/`` (the bench's sweeps), ``result.json`` (everything the report reads). The evaluation cache
``WORK/evals`` is shared by every seed and stage.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentmerge.api import dumps_json
from agentmerge_zoo.real.config import RealConfig
from agentmerge_zoo.real.suite import HELD_OUT, lineup_of

Log = Callable[[str], None]


def seed_dir(work: Path, seed: int) -> Path:
    return work / f"seed{seed}"


def agent_paths(cfg: RealConfig, work: Path, seed: int) -> dict[str, Path]:
    """Each agent's folder, in the lineup's order (``cfg.trained``)."""
    return {skill: seed_dir(work, seed) / f"agent_{skill}" for skill in cfg.trained}


def stage_agents(cfg: RealConfig, base: Path, work: Path, seed: int, log: Log) -> dict[str, Any]:
    """Each agent trained (or kept when finished): one after another in this process, or, with the bench's
    ``concurrent`` above 1, that many at once in worker processes of ``threads`` torch threads each (the agents are
    independent; each one's bits do not depend on where it trains). ``log`` must pickle to reach the workers."""
    from agentmerge_zoo.real.train import finished, train_agent

    jobs = {
        s: (base, out, cfg.recipe(s), seed, cfg.checkpoint_every, log)
        for s, out in agent_paths(cfg, work, seed).items()
    }
    todo = [s for s, job in jobs.items() if finished(job[1], job[2], seed) is None]
    workers = min(cfg.bench.concurrent, len(todo))
    if workers < 2:
        return {s: train_agent(*job) for s, job in jobs.items()}
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from agentmerge_zoo.real import suite

    init = (cfg.bench.threads, dict(suite.SKILLS))
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=_worker, initargs=init) as pool:
        futures = {s: pool.submit(train_agent, *job) for s, job in jobs.items()}
        return {s: f.result() for s, f in futures.items()}


def _worker(threads: int, skills: dict[str, Any]) -> None:
    """A training worker: the parent's torch threads per process and its suite (a skill registered in the parent
    process, e.g. by a test, trains the same in the worker)."""
    import torch

    from agentmerge_zoo.real import suite

    torch.set_num_threads(threads)
    suite.SKILLS.update(skills)


def drift(base: Path, agent: Path) -> float:
    """||theta - theta0|| / ||theta0|| over every floating tensor (tied copies once), in float64 sums."""
    from safetensors import safe_open

    diff = norm = 0.0
    with safe_open(str(base / "model.safetensors"), "pt") as b, safe_open(str(agent / "model.safetensors"), "pt") as a:
        for name in b.keys():  # noqa: SIM118  (safe_open has no __iter__)
            t0 = b.get_tensor(name).double()
            diff += float((a.get_tensor(name).double() - t0).pow(2).sum())
            norm += float(t0.pow(2).sum())
    return math.sqrt(diff / norm) if norm else 0.0


def _probe(base: Path, agents: dict[str, Path]) -> dict[str, Any]:
    """The probe of the agents (in the lineup's order, ``agents``'), with each one's drift."""
    from agentmerge import probe

    result = probe(str(base), [str(p) for p in agents.values()], labels=list(agents), quiet=True)
    rows = {
        a.name: {"density": a.density, "overlap": a.overlap, "independent": indep, "rho": a.rho, "lambda": a.lam}
        for a, indep in zip(result.agents, result.independent, strict=True)
    }
    for skill in agents:
        rows[skill]["drift"] = drift(base, agents[skill])
    return rows


def stage_check(cfg: RealConfig, base: Path, work: Path, seed: int, cache: Path, log: Log) -> dict[str, Any]:
    """The base and the agents on test, the convergence check, the probe; ``check.json``."""
    from agentmerge_zoo.evaluate import file_digest
    from agentmerge_zoo.real.convergence import check_agent
    from agentmerge_zoo.real.evaluate import evaluate_cached

    path = seed_dir(work, seed) / "check.json"
    agents = agent_paths(cfg, work, seed)
    digests = {s: file_digest(p) for s, p in agents.items()}
    if path.is_file():
        done: dict[str, Any] = json.loads(path.read_text())
        if done.get("digests") == digests:  # the same agents (a retrained agent checks again)
            return done
    skills = [*cfg.trained, *HELD_OUT]
    n = cfg.bench.n_test  # the merges' test prompts: gains and held-out changes compare on the same prompts
    out: dict[str, Any] = {"base": evaluate_cached(base, skills, "test", n, cache)}
    out["agents"] = {s: evaluate_cached(p, skills, "test", n, cache) for s, p in agents.items()}
    log(f"seed {seed}: base and agents scored on test")
    scratch = seed_dir(work, seed) / "check"
    out["convergence"] = {s: check_agent(base, p, s, scratch, cfg.n_check, cache, log=log) for s, p in agents.items()}
    out["probe"] = _probe(base, agents)
    out["digests"] = digests
    path.write_text(dumps_json(out) + "\n")
    return out


def stage_fisher(cfg: RealConfig, work: Path, seed: int) -> dict[str, Path]:
    """Each agent's diagonal Fisher on its own skill's training prompts with its greedy answers."""

    from agentmerge.api import estimate_fisher
    from agentmerge_zoo.evaluate import file_digest
    from agentmerge_zoo.real.sampling import greedy, prompt_ids
    from agentmerge_zoo.real.suite import skill
    from agentmerge_zoo.real.tasks import train_stream

    out = {}
    for name, agent in agent_paths(cfg, work, seed).items():
        folder = seed_dir(work, seed) / "fisher" / f"{name}-{file_digest(agent)}"
        if not (folder / "fisher.json").is_file():
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer

            tok = AutoTokenizer.from_pretrained(str(agent))
            model: Any = AutoModelForCausalLM.from_pretrained(str(agent), dtype=torch.float32)
            model.eval()
            stream = train_stream(skill(name), seed, "fisher")
            examples = [next(stream) for _ in range(cfg.bench.fisher_texts)]
            ids = [prompt_ids(tok, ex.messages()) for ex in examples]
            answers = greedy(model, tok, ids, skill(name).max_new_tokens)
            texts = [str(tok.decode(i)) + a + str(tok.eos_token) for i, a in zip(ids, answers, strict=True)]
            estimate_fisher(str(agent), str(folder), texts=texts, max_tokens=512)
        out[name] = folder
    return out


def stage_bench(cfg: RealConfig, inputs: Any, work: Path, seed: int, session: Any, log: Log) -> dict[str, Any]:
    from agentmerge_zoo.real.bench_seed import bench_seed

    return bench_seed(inputs, cfg.bench, seed_dir(work, seed), session, log)


def stage_humaneval(inputs: Any, work: Path, seed: int, bench: dict[str, Any], plan: Any, log: Log) -> dict[str, Any]:
    """HumanEval of the seed's rows (``humaneval.stage_humaneval``), or the note that it was not run (no plan: no
    consent, and nothing of the model's code runs)."""
    from agentmerge_zoo.real import humaneval

    if plan is None:
        return dict(humaneval.NOT_RUN)
    return humaneval.stage_humaneval(plan, inputs, bench, seed_dir(work, seed), log)


def stage_bfcl_whole(plan: Any, inputs: Any, work: Path, seed: int, bench: dict[str, Any], log: Log) -> dict[str, Any]:
    """BFCL's whole test for the base, the BFCL agent and the leading merges (``bfcl_whole``)."""
    from agentmerge_zoo.real.bfcl_whole import stage_bfcl_whole as whole

    return whole(plan, inputs, bench, seed_dir(work, seed), log)


def seed_inputs(cfg: RealConfig, base: Path, work: Path, seed: int, cache: Path) -> Any:
    """What the seed's bench merges (``bench.SeedInputs``), its Fisher files made first when a method needs them."""
    from agentmerge_zoo.evaluate import file_digest
    from agentmerge_zoo.real.bench import SeedInputs, needs_fisher

    agents = agent_paths(cfg, work, seed)
    wants_fisher = any(needs_fisher(m) for m in (cfg.bench.methods or ("fisher",)))
    fisher = stage_fisher(cfg, work, seed) if wants_fisher else {}
    digests = "-".join(file_digest(p) for p in agents.values())
    return SeedInputs(base, agents, fisher, cache, f"{cfg.fingerprint()}-{digests}")


STAGES = ("agents", "check", "bench")
CURVE_KEYS = ("step", "reward", "strict", "signal", "seconds", "cpu_seconds")


def run_stages(
    cfg: RealConfig,
    base: Path,
    work: Path,
    seed: int,
    session: Any,
    log: Log,
    until: str = "bench",
    humaneval: Any = None,
) -> None:
    """The stages of one seed up to ``until``; after the bench, HumanEval when ``humaneval`` (a
    ``humaneval.HumanEvalPlan``: the user allowed the model's code to run) is given, then ``result.json``
    (everything the report reads)."""
    cache = work / "evals"
    check_lineup(cfg, work, seed)
    metas = stage_agents(cfg, base, work, seed, log)
    if until == "agents":
        return
    check = stage_check(cfg, base, work, seed, cache, log)
    if until == "check":
        return
    inputs = seed_inputs(cfg, base, work, seed, cache)  # once: it hashes every agent's weights
    bench = stage_bench(cfg, inputs, work, seed, session, log)
    curves = {s: [{k: r[k] for k in CURVE_KEYS} for r in m["curve"]] for s, m in metas.items()}
    result = {"seed": seed, "config": cfg.to_dict(), "check": check, "bench": bench, "curves": curves}
    if cfg.whole is not None and "bfcl" in cfg.trained:
        result["bfcl_whole"] = stage_bfcl_whole(cfg.whole, inputs, work, seed, bench, log)
    result["humaneval"] = stage_humaneval(inputs, work, seed, bench, humaneval, log)
    (seed_dir(work, seed) / "result.json").write_text(dumps_json(result) + "\n")


def check_lineup(cfg: RealConfig, work: Path, seed: int) -> None:
    """Refuse a seed folder whose ``result.json`` is another lineup's (its check and sweeps would be overwritten)."""
    from agentmerge import ConfigError

    done = seed_dir(work, seed) / "result.json"
    if done.is_file() and (theirs := lineup_of(json.loads(done.read_text()))) != cfg.trained:
        raise ConfigError(
            f"{done} is the lineup {', '.join(theirs)}'s, not {', '.join(cfg.trained)}'s: pass another --work"
        )
