"""What the statistics passes keep across runs, per input set: overlap histograms and adaptive mask thresholds."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from agentmerge.io.cache.store import InputSetStore
from agentmerge.methods.masks import Levels, levels_from_json, levels_key, levels_to_json
from agentmerge.methods.spec import MaskRule


class OverlapCache:
    """Overlap histograms of one input set (files in order), per tensor and mask rule, kept across runs.

    Stored in ``cache_dir() / stats`` (``cache.InputSetStore``: keyed by the files' identities, so a changed
    file never reuses an old count); a tensor's entry is keyed by its rule (``MaskRule.key``: the plain
    rule's is its epsilon, as before). ``AGENTMERGE_NO_CACHE=1`` turns it off.
    """

    def __init__(self, files: Sequence[Sequence[Path]]) -> None:
        self.store = InputSetStore("stats", files)

    @staticmethod
    def _key(name: str, rule: MaskRule) -> str:
        return f"{name}|{rule.key}"

    def get(self, rules: Mapping[str, MaskRule], n: int) -> dict[str, torch.Tensor]:
        """The cached ``[N, N]`` histograms of these tensors under these rules (those it has)."""
        found = self.store.get(self._key(name, rule) for name, rule in rules.items())
        out = {}
        for name, rule in rules.items():
            rows = found.get(self._key(name, rule))
            if isinstance(rows, list) and len(rows) == n and all(_counts(r, n) for r in rows):
                out[name] = torch.tensor(rows, dtype=torch.int64)
        return out

    def put(self, hists: Mapping[str, torch.Tensor], rules: Mapping[str, MaskRule]) -> None:
        self.store.put({self._key(name, rules[name]): h.tolist() for name, h in hists.items()})


class LevelsCache:
    """Adaptive mask thresholds of one input set, per tensor and rule, kept across runs (``cache_dir() / levels``).

    Keyed like ``OverlapCache`` by the files' identities; a tensor's entry by ``masks.levels_key`` (the
    rule with its ``epsilon_q``, or the valley's epsilon, seed and fit settings). Values are stored as the
    exact float32 thresholds, so a merge that reads them is bit-identical to one that computed them.
    """

    def __init__(self, files: Sequence[Sequence[Path]]) -> None:
        self.store = InputSetStore("levels", files)

    def get(self, rules: Mapping[str, MaskRule], n: int) -> dict[str, Levels]:
        """The cached thresholds of these tensors under these rules (those it has, for ``n`` agents)."""
        found = self.store.get(levels_key(name, rule) for name, rule in rules.items())
        out = {}
        for name, rule in rules.items():
            levels = levels_from_json(found.get(levels_key(name, rule)), n)
            if levels is not None:
                out[name] = levels
        return out

    def put(self, levels: Mapping[str, Levels], rules: Mapping[str, MaskRule]) -> None:
        self.store.put({levels_key(name, rules[name]): levels_to_json(lv) for name, lv in levels.items()})


def _counts(row: object, n: int) -> bool:
    """A histogram row as counted: ``n`` whole numbers >= 0 (anything else in the cache is recomputed)."""
    return isinstance(row, list) and len(row) == n and all(type(v) is int and 0 <= v < 1 << 62 for v in row)
