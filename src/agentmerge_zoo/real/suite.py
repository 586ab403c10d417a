"""The real zoo's suite: the three trained skills and the held-out one, by name."""

from __future__ import annotations

from agentmerge_zoo.real.skill_bfcl import BfclSkill
from agentmerge_zoo.real.skill_code import CodeSkill
from agentmerge_zoo.real.skill_heldout import CapitalsSkill
from agentmerge_zoo.real.skill_memory import MemorySkill
from agentmerge_zoo.real.skill_tool import ToolSkill
from agentmerge_zoo.real.tasks import Skill

TRAINED = ("tool", "code", "memory")  # one agent each
HELD_OUT = ("capitals",)  # no agent trains on it: forgetting
SKILLS: dict[str, Skill] = {
    "tool": ToolSkill(),
    "code": CodeSkill(),
    "memory": MemorySkill(),
    "capitals": CapitalsSkill(),
    "bfcl": BfclSkill(),  # the BFCL tool agent's (docs/real/bfcl.md); not in TRAINED's zoo yet
}


def skill(name: str) -> Skill:
    if name not in SKILLS:
        raise KeyError(f"unknown skill {name!r}; the suite has {', '.join(SKILLS)}")
    return SKILLS[name]
