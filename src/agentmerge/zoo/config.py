"""Sizes, budgets and RL recipes of the zoo: the full configuration and the tiny smoke one.

Three agents come from three "teams" with different recipes (learning rate, steps, group size, prompts per
step), as independently post-trained agents would. All randomness derives from the pipeline seed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from agentmerge.zoo.grpo import Recipe
from agentmerge.zoo.modeling import ModelShape
from agentmerge.zoo.pretrain import PretrainConfig
from agentmerge.zoo.tasks import SUITE_VERSION

DOMAINS = ("code", "tool", "memory")


def _full_recipes() -> tuple[Recipe, ...]:
    return (
        Recipe(domain="code", team="team-a", lr=1e-4, steps=80, prompts_per_step=16, group_size=8),
        Recipe(domain="tool", team="team-b", lr=1e-4, steps=50, prompts_per_step=12, group_size=8),
        Recipe(domain="memory", team="team-c", lr=5e-5, steps=50, prompts_per_step=16, group_size=8),
    )


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
        if part != "base":
            data["recipe"] = self.recipe(part).to_dict()
        blob = json.dumps(data, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def full_config() -> ZooConfig:
    """The configuration of the committed results."""
    return ZooConfig()


def smoke_config() -> ZooConfig:
    """Tiny sizes for CI: checks that every stage runs, not what wins."""
    tiny = ModelShape(hidden=32, layers=2, heads=2, intermediate=64, max_positions=160)
    recipes = tuple(replace(r, steps=2, prompts_per_step=4, group_size=4) for r in _full_recipes())
    return ZooConfig(
        shape=tiny,
        pretrain=PretrainConfig(steps=8, batch_size=16, warmup=2),
        recipes=recipes,
        n_val=16,
        n_test=24,
        eval_batch=64,
        name="smoke",
    )
