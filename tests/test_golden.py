"""Golden output bytes: every method, both kernel paths, one and many chunks, against digests recorded once.

A refactor that moves code must not move a single output byte. ``tests/golden_digests.json`` holds the sha256 of
the weight files of each merge below, recorded before the house was reorganised. A case that is missing from the
file fails; ``AGENTMERGE_GOLDEN_WRITE=1 pytest tests/test_golden.py`` records them anew (only ever on purpose:
new methods add their cases, old ones must not change).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from agentmerge import MergeConfig, ModelSpec, merge
from agentmerge.io.formats.roles import FISHER_MARK
from agentmerge.synthetic import write_family

GOLDEN = Path(__file__).with_name("golden_digests.json")
WRITE = os.environ.get("AGENTMERGE_GOLDEN_WRITE") == "1"

# (case name, method, params); every registry method at least once, the RAM family in its variants
CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("ram", "ram", {}),
    ("ram-elect", "ram", {"shared": "elect"}),
    ("ram-scale", "ram", {"scale": 1.5}),
    ("ram-grid", "ram", {"mask_dtype": "base"}),
    ("ram-percentile", "ram", {"epsilon_rule": "percentile", "epsilon_q": 40.0}),
    ("ram-valley", "ram", {"epsilon_rule": "valley"}),
    ("ram_plus", "ram_plus", {}),
    ("ram_plus-authors", "ram_plus", {"form": "authors"}),
    ("ram_plus-tensor", "ram_plus", {"scope": "tensor", "r": 0.3}),
    ("ram_plus-layer", "ram_plus", {"scope": "layer", "r": 0.5}),
    ("ram_plus-module", "ram_plus", {"scope": "module"}),
    ("ram_plus-pattern", "ram_plus", {"scope": "pattern", "groups": "*self_attn* re:layers\\.1\\."}),
    ("ram_fisher", "ram_fisher", {}),
    ("ram_fisher-r", "ram_fisher", {"r": 0.4}),
    ("unique_only", "unique_only", {"agent": 1}),
    ("linear", "linear", {}),
    ("task_arithmetic", "task_arithmetic", {"lambda": 0.7}),
    ("ties", "ties", {"density": 0.3}),
    ("dare_linear", "dare_linear", {"p": 0.4}),
    ("dare_ties", "dare_ties", {"p": 0.3, "density": 0.8}),
    ("breadcrumbs", "breadcrumbs", {}),
    ("della", "della", {}),
    ("model_stock", "model_stock", {}),
    ("slerp", "slerp", {"t": 0.3}),
    ("ram_ties", "ram_ties", {}),
    ("fisher", "fisher", {}),
    ("magmax", "magmax", {}),
    ("consensus", "consensus", {}),
    ("consensus-k1", "consensus", {"k": 1, "tall_lambda": 0.3, "lambda": 0.8}),
    ("sce", "sce", {}),
    ("sce-select", "sce", {"select_topk": 0.4}),
    ("karcher", "karcher", {}),
    ("multislerp", "multislerp", {}),
    ("nuslerp", "nuslerp", {}),
    ("nuslerp-rows", "nuslerp", {"nuslerp_flatten": False}),
    ("nuslerp-columns", "nuslerp", {"nuslerp_flatten": False, "nuslerp_row_wise": True}),
    ("task_arithmetic-lines", "task_arithmetic", {"lambda": 0.7, "lines_beta": 0.5}),
    ("magmax-lines", "magmax", {"lines_beta": 0.5}),
    ("ties-lines-alpha", "ties", {"lines_beta": 0.3, "lines_alpha": 0.2}),
    ("tsv", "tsv", {}),
    ("iso_c", "iso_c", {}),
    ("iso_cts", "iso_cts", {"common_space_fraction": 0.6}),
    ("cart", "cart", {}),
    ("resmerge", "resmerge", {}),
    ("task_arithmetic-svc", "task_arithmetic", {"lambda": 0.7, "calibrate": "svc"}),
    ("tsv-svc-no-embeddings", "tsv", {"calibrate": "svc", "svd_embeddings": False}),
]
FISHER_METHODS = {"fisher", "ram_fisher"}
PATHS = [("fused", None), ("reference", None), ("fused", 997), ("reference", 997)]  # kernel path, chunk size


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path], list[Path]]:
    """A fixed tiny Qwen2 family (bf16 base, three agents of 3 / 46 / 54 % density) and a Fisher file per agent."""
    root = tmp_path_factory.mktemp("golden")
    base, agents = write_family(root, "tiny", [0.03, 0.46, 0.54], seed=11)
    fishers = []
    for i, agent in enumerate(agents):
        g = torch.Generator().manual_seed(100 + i)
        from safetensors import safe_open

        with safe_open(str(next(agent.glob("*.safetensors"))), "pt") as f:
            shapes = {k: f.get_slice(k).get_shape() for k in f.keys()}  # noqa: SIM118
        folder = root / f"fisher{i}"
        folder.mkdir()
        values = {k: torch.rand(*s, generator=g) * 3 for k, s in sorted(shapes.items())}
        save_file(values, str(folder / "model.safetensors"), metadata=dict([FISHER_MARK]))
        fishers.append(folder)
    return base, agents, fishers


def weights_digest(folder: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(folder.glob("*.safetensors")):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def run_case(
    family: tuple[Path, list[Path], list[Path]], method: str, params: dict[str, Any], chunk: int | None, out: Path
) -> str:
    base, agents, fishers = family
    if method in ("slerp", "nuslerp"):
        agents = agents[:2]
    fisher = method in FISHER_METHODS
    models = [ModelSpec(path=str(a), fisher=str(f) if fisher else None) for a, f in zip(agents, fishers, strict=False)]
    cfg = MergeConfig(method=method, base=str(base), models=models, params=params, chunk_size=chunk, seed=3)
    merge(cfg, out, quiet=True, hashing="none")
    return weights_digest(out)


def test_golden_digests(
    family: tuple[Path, list[Path], list[Path]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorded: dict[str, str] = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    got: dict[str, str] = {}
    for name, method, params in CASES:
        for path, chunk in PATHS:
            monkeypatch.setenv("AGENTMERGE_FUSED", "1" if path == "fused" else "0")
            key = f"{name}/{path}/{chunk or 'whole'}"
            got[key] = run_case(family, method, params, chunk, tmp_path / key.replace("/", "_"))
    if WRITE:
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        recorded = got
    changed = {k: v for k, v in got.items() if recorded.get(k) != v}
    assert not changed, f"output bytes changed (or not recorded) for: {sorted(changed)}"


def test_paths_agree_per_case() -> None:
    """The recorded digests themselves: a kernel path or chunk size never changes the bytes of a method."""
    recorded: dict[str, str] = json.loads(GOLDEN.read_text())
    by_case: dict[str, set[str]] = {}
    for key, digest in recorded.items():
        by_case.setdefault(key.split("/")[0], set()).add(digest)
    assert {c for c, d in by_case.items() if len(d) > 1} == set()
    assert {name for name, _, _ in CASES} <= set(by_case)
