"""The real zoo's suite: every skill by name, the default lineup of trained skills and the held-out one.

A zoo's lineup (which skills get an agent, in order) is its configuration's (``RealConfig.trained``: its recipes'
skills); a seed's ``result.json`` records it in ``config.recipes`` (:func:`lineup_of`).
"""

from __future__ import annotations

from typing import Any

from agentmerge_zoo.real.skill_bfcl import BfclSkill
from agentmerge_zoo.real.skill_code import CodeSkill
from agentmerge_zoo.real.skill_heldout import CapitalsSkill
from agentmerge_zoo.real.skill_memory import MemorySkill
from agentmerge_zoo.real.skill_tool import ToolSkill
from agentmerge_zoo.real.tasks import Skill

TRAINED = ("tool", "code", "memory")  # the default lineup: one agent each
HELD_OUT = ("capitals",)  # no agent trains on it: forgetting
SKILLS: dict[str, Skill] = {
    "tool": ToolSkill(),
    "code": CodeSkill(),
    "memory": MemorySkill(),
    "capitals": CapitalsSkill(),
    "bfcl": BfclSkill(),  # the BFCL tool agent's (docs/real/bfcl.md; the "bfcl" lineup)
}


def skill(name: str) -> Skill:
    if name not in SKILLS:
        raise KeyError(f"unknown skill {name!r}; the suite has {', '.join(SKILLS)}")
    return SKILLS[name]


def lineup_of(result: dict[str, Any]) -> tuple[str, ...]:
    """The trained skills of a seed's ``result.json``, in agent order: its config's recipes, or the default lineup
    for a result without them (written before lineups were configurable)."""
    recipes = result.get("config", {}).get("recipes")
    return tuple(str(r["skill"]) for r in recipes) if recipes else TRAINED
