"""The fourth audit's tracebacks (issue 42): each bad input is one line naming the file or option, nothing written.

extract-lora at rank 1 (a plain bug: it must work) and on non-finite weights; karcher ``tol: 0``; moe configs,
prompts files, chat templates and token ids; converge evaluators, ``--work`` and ``--threads``; the zoo's tool-call
parser on deeply nested brackets. The sweep's ``--address`` cases are in ``test_hostile_hangs.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from agentmerge import MergeConfig, ModelSpec, merge
from agentmerge.cli import main
from agentmerge.engine.extract_lora import extract_lora
from agentmerge.io.checkpoint import Checkpoint
from agentmerge.io.lora import LoraModel
from hostile import model_folder, one_line_error

df = pytest.importorskip("densefamily")
Family = tuple[Path, list[Path]]


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Family:
    """A tiny dense Llama base and two agents that changed every tensor (read only: tests copy before editing)."""
    return df.family(tmp_path_factory.mktemp("llama"), "llama", 2, other=0.02)


def poisoned(folder: Path, to: Path, name: str, value: float) -> Path:
    """A copy of model folder ``folder`` at ``to`` whose tensor ``name`` has ``value`` at element 0."""
    import shutil

    shutil.copytree(folder, to)
    tensors = load_file(to / "model.safetensors")
    tensors[name].view(-1)[0] = value
    save_file(tensors, to / "model.safetensors", metadata={"format": "pt"})
    return to


def nothing_written(out: Path) -> None:
    assert not out.exists() and not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")]


# --------------------------------------------------------------------------- extract-lora


def test_rank_one_gives_the_best_rank_one_adapter(llama: Family, tmp_path: Path) -> None:
    """--rank 1 (it raised a RuntimeError in the scratch file): each module's B A is s_1 u_1 v_1^T of its delta."""
    base, agents = llama
    result = extract_lora(agents[0], base, tmp_path / "ad", rank=1)
    assert result.modules and all(m.rank == 1 for m in result.modules)
    with Checkpoint(base) as b, Checkpoint(agents[0]) as m, LoraModel(tmp_path / "ad", b) as lora:
        for record in result.modules:
            name = f"{record.module}.weight"
            shape = b.tensors[name].shape
            delta = (m.read(name).double() - b.read(name).double()).view(shape)
            u, s, vh = torch.linalg.svd(delta, full_matrices=False)
            best = s[0] * torch.outer(u[:, 0], vh[0])  # Eckart-Young's rank-1 approximation, float64
            got = lora.read(name).double().view(shape) - b.read(name).double().view(shape)
            assert torch.allclose(got, best, atol=1e-5), name


@pytest.mark.parametrize("flags", [["--rank", "1"], ["--energy", "0.05"]])
def test_rank_one_from_the_command_line(
    llama: Family, tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str]
) -> None:
    base, agents = llama
    out = tmp_path / "ad"
    assert main(["extract-lora", str(agents[1]), "--base", str(base), "-o", str(out), "--quiet", *flags]) == 0
    assert (out / "adapter_model.safetensors").is_file()
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("which", "value", "says"),
    [
        ("model", float("nan"), "NaN or Inf"),
        ("model", float("inf"), "NaN or Inf"),
        ("base", float("nan"), "NaN or Inf"),
        ("base", float("-inf"), "NaN or Inf"),
        ("model", 3e38, "overflows float32"),  # finite weights, but model - base is not
    ],
)
def test_non_finite_linear_weights_are_one_line(
    llama: Family, tmp_path: Path, capsys: pytest.CaptureFixture[str], which: str, value: float, says: str
) -> None:
    base, agents = llama
    name = "model.layers.0.self_attn.q_proj.weight"
    model = str(agents[0])
    if which == "base":
        base = poisoned(base, tmp_path / "base", name, value)
    else:
        model = str(poisoned(agents[0], tmp_path / "model", name, value))
        if value == 3e38:
            base = poisoned(base, tmp_path / "base", name, -3e38)
    out = tmp_path / "ad"
    argv = ["extract-lora", model, "--base", str(base), "-o", str(out), "--rank", "2", "--quiet"]
    line = one_line_error(argv, capsys, says, name)
    assert (str(base) if which == "base" else model) in line
    nothing_written(out)


# --------------------------------------------------------------------------- karcher tol: 0

SCALARS = {"model.embed_tokens.weight": (16, 8), "model.norm.weight": (1,), "model.scale": ()}


def karcher_runs(a: Path, b: Path, out: Path, how: str) -> dict[str, torch.Tensor]:
    """Karcher of models ``a`` and ``b`` at ``tol: 0`` written by flags or by a mergekit YAML; the output's tensors."""
    if how == "flags":
        argv = [
            "merge",
            "--method",
            "karcher",
            "--model",
            str(a),
            "--model",
            str(b),
            "--param",
            "tol=0",
            "-o",
            str(out),
        ]
    else:
        doc = {"merge_method": "karcher", "models": [{"model": str(a)}, {"model": str(b)}], "parameters": {"tol": 0}}
        (out.parent / "mk.yaml").write_text(yaml.safe_dump(doc))
        argv = ["merge", str(out.parent / "mk.yaml"), str(out)]
    assert main([*argv, "--quiet"]) == 0
    return load_file(out / "model.safetensors")


@pytest.mark.parametrize("how", ["flags", "mergekit"])
def test_karcher_tol_zero_merges_identical_and_one_element_tensors(tmp_path: Path, how: str) -> None:
    """``tol: 0`` (in its range) divided by a zero angle: identical inputs give that input back, a one-element
    or 0-D tensor the mean length in the common direction, and every tensor equals the default tol's result."""
    a, b = (model_folder(tmp_path / f"m{i}", i, SCALARS) for i in (1, 2))
    same = load_file(a / "model.safetensors")
    for name, got in karcher_runs(a, a, tmp_path / "same", how).items():
        assert torch.equal(got, same[name]), name
    got = karcher_runs(a, b, tmp_path / "two", how)
    models = [ModelSpec(path=str(a)), ModelSpec(path=str(b))]
    merge(MergeConfig(method="karcher", models=models), tmp_path / "default", quiet=True)
    default = load_file(tmp_path / "default" / "model.safetensors")
    assert all(torch.equal(got[n], default[n]) for n in default)
    x, y = float(same["model.scale"]), float(load_file(b / "model.safetensors")["model.scale"])
    assert x * y > 0  # same sign: the angle between them is 0
    want = torch.tensor((abs(x) + abs(y)) / 2 * (1 if x > 0 else -1)).bfloat16()
    assert torch.equal(got["model.scale"], want)


def test_karcher_coefficients_at_tol_zero_are_finite() -> None:
    """The kernel alone: a Gram matrix of parallel vectors, of one zero vector, of antipodal ones."""
    from agentmerge.methods.spherical import karcher_coefficients

    for g in ([[4.0, 6.0], [6.0, 9.0]], [[4.0, 0.0], [0.0, 0.0]], [[4.0, -6.0], [-6.0, 9.0]], [[1.0, 1.0], [1.0, 1.0]]):
        k = karcher_coefficients(torch.tensor(g, dtype=torch.float64), 10, 0.0)
        assert bool(torch.isfinite(k).all()), g
    g = torch.tensor([[4.0, 6.0], [6.0, 9.0]], dtype=torch.float64)  # y = 1.5 x, |x| = 2: the mean has length 2.5
    k = karcher_coefficients(g, 10, 0.0)
    assert float(k @ g @ k) == pytest.approx(2.5**2) and float(k @ g[0]) > 0
