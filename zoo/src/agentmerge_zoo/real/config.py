"""The real zoo's configuration: the three agents' GRPO recipes, evaluation sizes, the bench plan; and the smoke one.

Precision follows the paper's mix: the tool and memory agents train with float32 master weights and are exported
in bfloat16 (verl's regime), the code agent trains with bfloat16 weight storage (sparse updates). The steps,
group sizes and learning rates come from the measurements in docs/real/README.md (one seed, three agents, every
merge and the evaluation in about 2.5 hours on two idle cores with 60-step tool and code agents; their 240 steps
add about 4,900 CPU seconds).
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from agentmerge.api import dumps_json
from agentmerge_zoo.real.bench import BenchPlan
from agentmerge_zoo.real.bfcl_whole import WholePlan
from agentmerge_zoo.real.grpo_hf import Recipe
from agentmerge_zoo.real.tasks import SKILLS_VERSION


def full_recipes() -> tuple[Recipe, ...]:
    return (
        # 240 steps: at 60 (seeds 0 and 1 of docs/real/results.md) neither beat the base by 2 SE; seed 1's pilot
        # (docs/real/README.md, "More steps") clears it at 240 for both, the tool agent converged.
        Recipe(skill="tool", lr=5e-5, steps=240, prompts_per_step=2, group_size=8),
        Recipe(skill="code", lr=5e-5, steps=240, prompts_per_step=2, group_size=8, storage="bf16"),
        Recipe(skill="memory", lr=5e-5, steps=80, prompts_per_step=2, group_size=8),
    )


def bfcl_recipe() -> Recipe:
    """The BFCL tool agent's recipe (docs/real/bfcl.md): the tool agent's, sampled at temperature 0.7 (the ninth
    pilot's: at 1 the agents settled on answers that sampling cannot break, copies of the hint)."""
    return Recipe(skill="bfcl", lr=5e-5, steps=240, prompts_per_step=2, group_size=8, temperature=0.7)


def pilot_recipes() -> tuple[Recipe, ...]:
    """Every recipe a pilot may train: the three agents' and the BFCL tool agent's."""
    return (*full_recipes(), bfcl_recipe())


@dataclass(frozen=True)
class RealConfig:
    """Everything that decides a seed's agents and results."""

    recipes: tuple[Recipe, ...] = field(default_factory=full_recipes)
    n_check: int = 32  # validation prompts of the convergence check (own skill)
    bench: BenchPlan = field(default_factory=BenchPlan)
    checkpoint_every: int = 10
    name: str = "full"
    whole: WholePlan | None = None  # BFCL's whole test for the leading rows (a lineup with the BFCL agent)

    @property
    def trained(self) -> tuple[str, ...]:
        """The zoo's lineup: the skills that get an agent, in the recipes' order (the agents' order in every merge)."""
        return tuple(r.skill for r in self.recipes)

    def recipe(self, skill: str) -> Recipe:
        return next(r for r in self.recipes if r.skill == skill)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["recipes"] = [r.to_dict() for r in self.recipes]
        return data

    def fingerprint(self) -> str:
        """Short hash of the settings that decide the agents (recipes, skills version)."""
        data = {"recipes": [r.to_dict() for r in self.recipes], "skills": SKILLS_VERSION}
        return hashlib.sha256(dumps_json(data, sort_keys=True).encode()).hexdigest()[:12]


def bfcl_config() -> RealConfig:
    """The BFCL zoo (docs/real/bfcl.md): the BFCL tool agent in the tool agent's place, the code and memory agents'
    recipes of the default zoo."""
    keep = tuple(r for r in full_recipes() if r.skill in ("code", "memory"))
    return RealConfig(recipes=(bfcl_recipe(), *keep), name="bfcl", whole=WholePlan())


LINEUPS = {"default": RealConfig, "bfcl": bfcl_config}  # ``--lineup``: each one's full configuration


def lineup_config(lineup: str) -> RealConfig:
    """The full configuration of a named lineup (``LINEUPS``)."""
    return LINEUPS[lineup]()


def smoke_config(lineup: str = "default") -> RealConfig:
    """Tiny sizes for the tiny random Llama: checks every code path runs, not who wins. The bfcl lineup tests on 4
    prompts per skill (one BFCL item per category) and merges with fewer methods."""
    recipes = tuple(
        replace(r, steps=2, prompts_per_step=1, group_size=4, max_new_tokens=12, lr=1e-3)
        for r in lineup_config(lineup).recipes
    )
    if lineup != "default":
        plan = BenchPlan(n_val=2, n_test=4, grid=(1.0,), methods=("task_arithmetic", "ram", "ram_plus"), threads=1)
        plan = replace(plan, pair_methods=("ram",), dilution=False)
        whole = WholePlan(n=8, top=1, threads=1)  # two items per category
        return RealConfig(recipes, n_check=2, bench=plan, checkpoint_every=1, name=f"smoke-{lineup}", whole=whole)
    plan = BenchPlan(
        n_val=2,
        n_test=2,
        grid=(1.0, 2.0),
        methods=("linear", "task_arithmetic", "ties", "ram", "ram_plus", "fisher"),
        pair_methods=("ram",),
        fisher_texts=2,
        threads=1,
    )
    return RealConfig(recipes=recipes, n_check=2, bench=plan, checkpoint_every=1, name="smoke")
