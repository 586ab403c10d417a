"""Sizes, budgets and RL recipes of the zoo: the full configuration and the tiny smoke one.

Three agents come from three "teams" with different recipes (learning rate, steps, group size, prompts per
step), as independently post-trained agents would. The six-domain zoo of the many-agent study
(:func:`six_config`) adds three more teams (math, sort, search) and pretrains its own base on all six domains.
All randomness derives from the pipeline seed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from agentmerge.api import dumps_json
from agentmerge_zoo.grpo import Recipe
from agentmerge_zoo.modeling import ModelShape
from agentmerge_zoo.pretrain import PretrainConfig
from agentmerge_zoo.tasks import CORE_DOMAINS, SIX_DOMAINS, SUITE_VERSION

DOMAINS = CORE_DOMAINS


def _full_recipes(domains: tuple[str, ...] = DOMAINS) -> tuple[Recipe, ...]:
    recipes = (
        Recipe(domain="code", team="team-a", lr=1e-4, steps=80, prompts_per_step=16, group_size=8),
        Recipe(domain="tool", team="team-b", lr=1e-4, steps=50, prompts_per_step=12, group_size=8),
        Recipe(domain="memory", team="team-c", lr=5e-5, steps=50, prompts_per_step=16, group_size=8),
        Recipe(domain="math", team="team-d", lr=1e-4, steps=60, prompts_per_step=16, group_size=8),
        Recipe(domain="sort", team="team-e", lr=5e-5, steps=60, prompts_per_step=12, group_size=8),
        Recipe(domain="search", team="team-f", lr=1e-4, steps=40, prompts_per_step=16, group_size=8),
    )
    return tuple(r for r in recipes if r.domain in domains)


@dataclass(frozen=True)
class ZooConfig:
    """Everything that determines the zoo's checkpoints and evaluation sizes."""

    shape: ModelShape = field(default_factory=ModelShape)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    recipes: tuple[Recipe, ...] = field(default_factory=_full_recipes)
    n_val: int = 300
    n_test: int = 1000
    eval_batch: int = 250
    name: str = "full"
    regime: str = "bf16"
    domains: tuple[str, ...] = DOMAINS  # the agents' domains (and the suite the base is pretrained on)

    @property
    def suite(self) -> str:
        """``core`` (code, tool, memory) or ``six`` (the many-agent study's zoo)."""
        return "core" if self.domains == DOMAINS else "six"

    def recipe(self, domain: str) -> Recipe:
        for recipe in self.recipes:
            if recipe.domain == domain:
                return recipe
        raise KeyError(domain)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["recipes"] = [r.to_dict() for r in self.recipes]
        return data

    def fingerprint(self, part: str) -> str:
        """Short hash of the settings that determine one stage ('base' or an agent domain)."""
        data: dict[str, Any] = {"shape": asdict(self.shape), "pretrain": asdict(self.pretrain)}
        data["suite_version"] = SUITE_VERSION
        data["n_val"], data["n_test"] = self.n_val, self.n_test
        if self.domains != DOMAINS:  # the core zoo's fingerprints predate the field and stay as they were
            data["domains"] = list(self.domains)
        if part != "base":
            data["recipe"] = self.recipe(part).to_dict()
        return self._hash(data)

    def agent_fingerprint(self, recipe: Recipe) -> str:
        """Fingerprint of an agent trained (and exported) by ``recipe`` from this config's base."""
        data: dict[str, Any] = {"shape": asdict(self.shape), "pretrain": asdict(self.pretrain)}
        data["suite_version"] = SUITE_VERSION
        data["n_val"], data["n_test"] = self.n_val, self.n_test
        if self.domains != DOMAINS:
            data["domains"] = list(self.domains)
        data["recipe"] = recipe.to_dict()
        return self._hash(data)

    @staticmethod
    def _hash(data: dict[str, Any]) -> str:
        blob = dumps_json(data, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------- precision regimes
# Each regime is a set of three recipes that differ in how the weights are stored while training and in what
# dtype the agent is saved. The learning rates and steps of the non-bf16 regimes were chosen by short pilot runs
# (scripts/zoo_pilot.py, docs/zoo.md) so that the densities land near the paper's range where the recipe allows.
FP32_LR = {"code": 3e-6, "tool": 3e-6, "memory": 3e-6, "math": 3e-6, "sort": 3e-6, "search": 3e-6}
FP32_STEPS = {"code": 160, "tool": 100, "memory": 100, "math": 100, "sort": 100, "search": 80}
SPARSE_CODE_LR = 1.5e-5
SPARSE_CODE_STEPS = 200


def _fp32_master(recipe: Recipe, export: str) -> Recipe:
    d = recipe.domain
    return replace(recipe, storage="fp32_master", export=export, lr=FP32_LR[d], steps=FP32_STEPS[d])


def _sparse_bf16(recipe: Recipe) -> Recipe:
    return replace(recipe, lr=SPARSE_CODE_LR, steps=SPARSE_CODE_STEPS)


def regime_recipes(regime: str, domains: tuple[str, ...] = DOMAINS) -> tuple[Recipe, ...]:
    """The agents' recipes of a precision regime (see REGIMES), one per domain."""
    base = _full_recipes(domains)
    if regime == "bf16":
        return base
    if regime == "fp32_bf16":
        return tuple(_fp32_master(r, "bf16") for r in base)
    if regime == "fp32_fp32":
        return tuple(_fp32_master(r, "fp32") for r in base)
    if regime == "paper_like":  # the code agent sparse (bf16 storage), every other agent fp32 master saved bf16
        return tuple(_sparse_bf16(r) if r.domain == "code" else _fp32_master(r, "bf16") for r in base)
    raise ValueError(f"unknown regime {regime!r}; use one of {', '.join(REGIMES)}")


REGIMES: dict[str, str] = {
    "bf16": "bf16 weight storage (rounded after every step), saved bf16 - TRL-style training of a bf16 model",
    "fp32_bf16": "fp32 master weights, saved bf16 - verl (fp32 master, converter casts the export to bf16)",
    "fp32_fp32": "fp32 master weights, saved fp32 - an fp32 release (the paper's tool agent, ToolRL)",
    "paper_like": "code: bf16 storage at a low lr (sparse, like the paper's 3 % code agent); tool and memory: fp32 "
    "master saved bf16 (about half dense, like the paper's tool and memory agents)",
}


def regime_dir(cfg: ZooConfig, work: Path) -> Path:
    """The regime's work folder: ``WORK/{regime}``, the six-domain zoo's ``WORK/many/{regime}``."""
    return work / "many" / cfg.regime if cfg.suite == "six" else work / cfg.regime


def seed_dirs(cfg: ZooConfig, work: Path, seed: int) -> tuple[Path, Path]:
    """One seed's work folders: the root of its merges (sweeps, check scratch) under :func:`regime_dir`, and its
    evaluation cache (``WORK/evals/seed{S}``, the six-domain zoo's ``WORK/evals/six/seed{S}``)."""
    evals = work / "evals" / "six" if cfg.suite == "six" else work / "evals"
    return regime_dir(cfg, work) / f"seed{seed}", evals / f"seed{seed}"


def with_steps(cfg: ZooConfig, steps: Mapping[str, int]) -> ZooConfig:
    """``cfg`` with some agents' RL steps changed (``{domain: steps}``; others kept): the convergence loop's knob.
    A longer recipe continues the shorter one's saved training (``build.latest_state``)."""
    unknown = sorted(set(steps) - {r.domain for r in cfg.recipes})
    if unknown or any(n < 1 for n in steps.values()):
        raise ValueError(f"steps: unknown domain(s) {unknown} or a count below 1 in {dict(steps)}")
    return replace(cfg, recipes=tuple(replace(r, steps=steps.get(r.domain, r.steps)) for r in cfg.recipes))


def parse_steps(text: str) -> dict[str, int]:
    """``memory=200,code=160`` -> ``{"memory": 200, "code": 160}`` (``--steps``)."""
    out: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",")):
        name, sep, value = part.partition("=")
        if part and (not sep or not value.strip().isdigit()):
            raise ValueError(f"--steps: {part!r} is not DOMAIN=STEPS (e.g. memory=200)")
        if part:
            out[name.strip()] = int(value)
    return out


def full_config(regime: str = "bf16") -> ZooConfig:
    """The configuration of the committed results, for one precision regime."""
    return ZooConfig(recipes=regime_recipes(regime), regime=regime)


def six_pretrain(steps: int = 1000) -> PretrainConfig:
    """Base pretraining of the six-domain zoo: every domain in the mixture, each with its wrong habit."""
    mixture = {"code": 1.0, "tool": 1.5, "memory": 0.8, "math": 0.6, "sort": 0.6, "search": 0.6, "heldout": 0.5}
    return PretrainConfig(steps=steps, mixture=mixture, distractor_rate={d: 0.5 for d in SIX_DOMAINS})


def six_config(regime: str = "fp32_bf16") -> ZooConfig:
    """The six-domain zoo of the many-agent study: its own base, one agent per domain of SIX_DOMAINS."""
    return ZooConfig(
        pretrain=six_pretrain(), recipes=regime_recipes(regime, SIX_DOMAINS), regime=regime, domains=SIX_DOMAINS
    )


def smoke_config(regime: str = "bf16", domains: tuple[str, ...] = DOMAINS) -> ZooConfig:
    """Tiny sizes for CI: checks that every stage runs, not what wins."""
    tiny = ModelShape(hidden=32, layers=2, heads=2, intermediate=64, max_positions=160)
    recipes = tuple(replace(r, steps=2, prompts_per_step=4, group_size=4) for r in regime_recipes(regime, domains))
    pretrain = PretrainConfig(steps=8, batch_size=16, warmup=2)
    if domains != DOMAINS:
        pretrain = replace(six_pretrain(8), batch_size=16, warmup=2)
    return ZooConfig(
        shape=tiny,
        pretrain=pretrain,
        domains=domains,
        recipes=recipes,
        n_val=16,
        n_test=24,
        eval_batch=64,
        name="smoke",
        regime=regime,
    )
