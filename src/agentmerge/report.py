"""Rendering: probe results as markdown and plots, the merged model's card and its merge.json record."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

import agentmerge
from agentmerge.probe import AgentStats, ProbeResult, agent_stats

if TYPE_CHECKING:
    from agentmerge.config import MergeConfig
    from agentmerge.merge import Inputs, MergeResult


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def _rho(x: float) -> str:
    return f"{x:.3f}" if x != float("inf") else "inf"


def agents_table(agents: list[AgentStats], independent: list[list[float]] | None = None) -> str:
    """Markdown: one row per agent with density, overlap w.0..w.(N-1), rho and the RAM+ lambda."""
    n = len(agents)
    head = ["agent", "density %", *[f"w.{k} %" for k in range(n)], "rho", "lambda (RAM+)"]
    if independent:
        head.append("w.0 % if independent")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, a in enumerate(agents):
        cells = [a.name, _pct(a.density), *[_pct(x) for x in a.overlap], _rho(a.rho), f"{a.lam:.4f}"]
        if independent:
            cells.append(_pct(independent[i][0]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def density_grid(groups: dict[str, list[AgentStats]], title: str) -> str:
    """Markdown: density % per group (rows) and agent (columns)."""
    if not groups:
        return ""
    names = [a.name for a in next(iter(groups.values()))]
    lines = [f"| {title} | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 1)]
    for g, agents in groups.items():
        lines.append(f"| {g} | " + " | ".join(_pct(a.density) for a in agents) + " |")
    return "\n".join(lines)


def probe_markdown(p: ProbeResult) -> str:
    """The full probe report: summary table, per module type and per layer densities."""
    parts = [
        f"# Task-vector probe\n\nbase: `{p.base}`; epsilon = {p.epsilon:g}; RAM+ lambda with r = {p.r:g}, "
        f"alpha = {p.alpha:g}. w.k: share of an agent's updated elements that exactly k other agents also updated.",
        "## Whole model\n\n" + agents_table(p.agents, p.independent),
        "## Density % per module type\n\n" + density_grid(p.per_module, "module"),
        "## Density % per layer\n\n" + density_grid(p.per_layer, "layer"),
    ]
    return "\n\n".join(parts) + "\n"


def plot_probe(p: ProbeResult, path: str | Path) -> None:
    """The paper's Figure 2 view: density per agent; overlap distribution per agent (vs independent); layers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [a.name for a in p.agents]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    axes[0].bar(names, [100 * a.density for a in p.agents], color="tab:blue")
    axes[0].set(title="density (|delta| > eps)", ylabel="% of parameters")
    _overlap_bars(axes[1], p, names)
    _layer_heatmap(fig, axes[2], p, names)
    for ax in axes[:2]:
        ax.tick_params(axis="x", rotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _overlap_bars(ax: Any, p: ProbeResult, names: list[str]) -> None:
    """Grouped bars w.0..w.(N-1) per agent; black x marks what independent masks would give."""
    n = len(names)
    width = 0.8 / n
    for k in range(n):
        xs = [i + (k - (n - 1) / 2) * width for i in range(n)]
        ax.bar(xs, [100 * a.overlap[k] for a in p.agents], width, label=f"w.{k}")
        expected = [100 * row[k] for row in p.independent]
        ax.scatter(xs, expected, marker="x", color="black", zorder=3, label="if independent" if k == 0 else None)
    ax.set_xticks(range(n), names)
    ax.set(title="overlap: shared with exactly k others", ylabel="% of the agent's updates", ylim=(0, 119))
    ax.legend(fontsize=8, loc="upper center", ncol=n + 1)


def _layer_heatmap(fig: Any, ax: Any, p: ProbeResult, names: list[str]) -> None:
    layers = list(p.per_layer)
    grid = [[100 * a.density for a in p.per_layer[layer]] for layer in layers]
    im = ax.imshow(grid or [[0.0]], aspect="auto", cmap="viridis")
    ax.set_xticks(range(len(names)), names, rotation=20)
    ax.set_yticks(range(len(layers)), ["other" if layer == "-" else layer for layer in layers])
    ax.set(title="density % per layer", ylabel="layer (other: embeddings, final norm, head)")
    fig.colorbar(im, ax=ax)


# --------------------------------------------------------------------------- merged model outputs


def merge_summary(result: MergeResult) -> list[AgentStats] | None:
    if result.model_hist is None:
        return None
    hist = torch.tensor(result.model_hist, dtype=torch.int64)
    return agent_stats(hist, result.numel, result.model_labels)


def model_card(cfg: MergeConfig, result: MergeResult) -> str:
    """README.md for the merged model, with front matter the Hugging Face hub reads."""
    base = cfg.base or cfg.models[0].path
    front = [
        "---",
        f"base_model: {json.dumps(base)}",
        "library_name: transformers",
        "tags:",
        "- merge",
        "- agentmerge",
        f"- {cfg.method}",
        "---",
        "",
    ]
    params = ", ".join(f"{k} = {v}" for k, v in sorted(result.params.items())) or "none"
    body = [
        f"# Merged with agentmerge ({cfg.method})\n",
        f"Method: **{cfg.method}** — {cfg.spec.summary}. Parameters: {params}.\n",
        f"Base: `{base}`\n\nModels:\n",
        *[f"- `{m.path}`" + (f" (weight {m.weight:g})" if m.weight != 1.0 else "") for m in cfg.models],
        "",
        f"Output dtype: {cfg.dtype or 'as the base'}; {result.merged_tensors} of {result.tensors} tensors merged; "
        f"seed {cfg.seed}; agentmerge {agentmerge.__version__}.\n",
    ]
    agents = merge_summary(result)
    if agents:
        body += ["## Task-vector overlap (epsilon as configured, default 1e-5)\n", agents_table(agents), ""]
    body.append("The resolved configuration and the input files are recorded in `merge.json`.\n")
    return "\n".join(front + body)


def reproducibility_record(
    cfg: MergeConfig, inputs: Inputs, result: MergeResult, hashes: InputHashes | None = None
) -> dict[str, Any]:
    """merge.json: the resolved configuration, tool versions, input files with sha256, statistics and timing."""
    ckpts = [inputs.reference, *inputs.models]
    sums = (hashes or InputHashes([f for c in ckpts for f in c.weight_files])).result()
    files = {}
    for ckpt in ckpts:
        files[str(ckpt.path)] = [
            {"file": f.name, "bytes": f.stat().st_size, "sha256": sums.get(str(f))} for f in ckpt.weight_files
        ]
    agents = merge_summary(result)
    return {
        "agentmerge": agentmerge.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "config": cfg.model_dump(mode="json"),
        "resolved_params": result.params,
        "inputs": files,
        "probe": [a.__dict__ | {"rho": a.rho if a.rho != float("inf") else "inf"} for a in agents or []],
        "seconds": round(result.seconds, 3),
    }


# --------------------------------------------------------------------------- input hashes

HASH_BLOCK = 8 * 1024 * 1024


class InputHashes:
    """sha256 of input weight files, computed on a background thread while the merge runs.

    hashlib releases the GIL on large blocks, so hashing overlaps the merge; reads hit the page cache the
    merge fills. Results are cached by (real path, size, mtime_ns, inode) in ``hash_cache_path()``, so
    repeated merges of the same inputs (parameter sweeps) hash nothing again; files in a Hugging Face cache
    are named by their sha256 already. ``AGENTMERGE_NO_HASH=1`` skips hashing (``sha256: null``).
    """

    def __init__(self, files: Sequence[Path], *, background: bool = False) -> None:
        self.files = [Path(f) for f in dict.fromkeys(str(f) for f in files)]
        self._sums: dict[str, str] = {}
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._run, name="agentmerge-hash", daemon=True)
            self._thread.start()

    @classmethod
    def start(cls, inputs: Inputs) -> InputHashes:
        """Start hashing every weight file of ``inputs`` in the background."""
        ckpts = [inputs.reference, *inputs.models]
        return cls([f for c in ckpts for f in c.weight_files], background=True)

    def cancel(self) -> None:
        """Stop before the next file (a failed merge should not keep reading its inputs)."""
        self._stop.set()

    def result(self) -> dict[str, str]:
        """``{str(path): hex digest}``; waits for the background thread (or hashes now)."""
        if self._thread is None:
            self._run()
        else:
            self._thread.join()
        if self._error is not None:
            raise self._error
        return dict(self._sums)

    def _run(self) -> None:
        if self._thread is not None:
            with contextlib.suppress(OSError, AttributeError):  # Linux: lower this thread's priority only
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        try:
            cache = _load_hash_cache()
            fresh = {}
            skip = os.environ.get("AGENTMERGE_NO_HASH") == "1"
            for f in self.files:
                if skip or self._stop.is_set():
                    continue
                key = _hash_key(f)
                digest = cache.get(key) or hub_blob_digest(f) or sha256_file(f)
                fresh[key] = digest
                self._sums[str(f)] = digest
            _save_hash_cache(cache | fresh)
        except BaseException as e:  # re-raised in result(), on the caller's thread
            self._error = e


def hub_blob_digest(path: Path) -> str | None:
    """The sha256 a Hugging Face cache already names the file by (``blobs/<sha256>``, LFS files), else None."""
    real = path.resolve()
    name = real.name
    if real.parent.name == "blobs" and len(name) == 64 and all(c in "0123456789abcdef" for c in name):
        return name
    return None


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in ``HASH_BLOCK`` pieces (bounded memory)."""
    h = hashlib.sha256()
    buf = bytearray(HASH_BLOCK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def hash_cache_path() -> Path:
    """``$AGENTMERGE_CACHE`` or ``$XDG_CACHE_HOME/agentmerge`` (default ``~/.cache/agentmerge``) / sha256.json."""
    root = (
        os.environ.get("AGENTMERGE_CACHE")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "agentmerge"
    )
    return Path(root) / "sha256.json"


def _hash_key(path: Path) -> str:
    st = path.stat()
    return f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}"


def _load_hash_cache() -> dict[str, str]:
    try:
        data = json.loads(hash_cache_path().read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str) and len(v) == 64}


def _save_hash_cache(entries: dict[str, str]) -> None:
    """Best effort: a read-only home or a full disk must not fail the merge."""
    path = hash_cache_path()
    keep = dict(list(entries.items())[-10_000:])
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
        tmp.write_text(json.dumps(keep))
        os.replace(tmp, path)
    except OSError:
        pass
