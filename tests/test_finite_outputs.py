"""Nothing broken is written with exit status 0 (issue 42): one finiteness rule for every reader, strict JSON.

``io.guards.finite.check_finite`` is the rule ``merge``, ``moe``, ``extract-lora`` and ``convert`` read inputs with:
a NaN or Inf anywhere stops the command in one line naming the file and tensor, and nothing is written.
"""

from __future__ import annotations

import ast
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import agentmerge
from agentmerge.cli import main

transformers = pytest.importorskip("transformers")
import densefamily as df  # noqa: E402

ENGINE = Path(agentmerge.__file__).parent / "engine"


def poison(folder: Path, part: str, value: float, where: tuple[int, ...] = (0,)) -> str:
    """Set one element of the first tensor whose name holds ``part`` to ``value``; returns the tensor's name."""
    path = folder / "model.safetensors"
    tensors = load_file(path)
    name = next(n for n in sorted(tensors) if part in n)
    tensors[name] = tensors[name].clone()
    tensors[name][where[: tensors[name].dim()]] = value
    save_file(tensors, path, metadata={"format": "pt"})
    return name


def scale(folder: Path, part: str, factor: float) -> str:
    path = folder / "model.safetensors"
    tensors = load_file(path)
    name = next(n for n in sorted(tensors) if part in n)
    tensors[name] = tensors[name] * factor
    save_file(tensors, path, metadata={"format": "pt"})
    return name


def one_line(argv: list[str], capsys: pytest.CaptureFixture[str], *words: str) -> str:
    capsys.readouterr()
    status = main(argv)
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.startswith("agentmerge: error")]
    assert status == 2 and len(lines) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def strict(path: Path) -> object:
    def refuse(word: str) -> None:
        raise AssertionError(f"{path}: not JSON ({word})")

    return json.loads(path.read_text(), parse_constant=refuse)


def test_every_reader_uses_the_one_rule() -> None:
    for module in ("inputs.py", "convert.py", "extract_lora.py", "moe/build.py"):
        names = {n.id for n in ast.walk(ast.parse((ENGINE / module).read_text())) if isinstance(n, ast.Name)}
        assert "check_finite" in names, module


# --------------------------------------------------------------------------- extract-lora


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    base, agents = df.family(tmp_path / "fam", "llama", 1, other=0.02)
    return base, agents[0]


@pytest.mark.parametrize(
    ("part", "value"),
    [("norm.weight", math.nan), ("norm.weight", math.inf), ("q_proj.weight", math.nan), ("embed", -math.inf)],
)
@pytest.mark.parametrize("who", ["model", "base"])
def test_extract_lora_refuses_non_finite_inputs(
    pair: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], part: str, value: float, who: str
) -> None:
    """NaN in a norm was recorded as unchanged, Inf saved in modules_to_save, NaN in a linear layer a traceback."""
    base, model = pair
    name = poison(model if who == "model" else base, part, value)
    out = tmp_path / "ad"
    argv = ["extract-lora", str(model), "--base", str(base), "-o", str(out), "--rank", "2", "--quiet"]
    one_line(argv, capsys, name, "NaN or Inf")
    assert not out.exists()


def test_extract_lora_huge_weights_give_the_errors_of_the_scaled_model(pair: tuple[Path, Path], tmp_path: Path) -> None:
    """A linear layer 1e30 times larger in model and base: the same relative errors (scale-free), strict JSON.

    Before: ``||dW||^2`` overflowed float32, every error was NaN and extraction.json held a bare ``NaN``.
    """
    base, model = pair
    argv = ["extract-lora", str(model), "--base", str(base), "--rank", "2", "--quiet"]
    assert main([*argv, "-o", str(tmp_path / "plain"), "--json", str(tmp_path / "plain.json")]) == 0
    name = scale(base, "layers.0.mlp.down_proj", 1e30)
    assert scale(model, "layers.0.mlp.down_proj", 1e30) == name
    assert main([*argv, "-o", str(tmp_path / "huge"), "--json", str(tmp_path / "huge.json")]) == 0
    plain, huge = strict(tmp_path / "plain.json"), strict(tmp_path / "huge.json")
    assert strict(tmp_path / "huge" / "extraction.json")["modules"] == huge["modules"]  # type: ignore[index]
    errors = {m["module"]: m["error_stored"] for m in plain["modules"]}  # type: ignore[index]
    for m in huge["modules"]:  # type: ignore[index]
        assert math.isfinite(m["error_stored"]) and m["error_stored"] == pytest.approx(errors[m["module"]], rel=1e-3)


def test_extract_lora_refuses_a_delta_that_overflows(
    pair: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, model = pair
    name = poison(model, "layers.0.mlp.up_proj", 3e38)
    poison(base, "layers.0.mlp.up_proj", -3e38)
    argv = ["extract-lora", str(model), "--base", str(base), "-o", str(tmp_path / "ad"), "--rank", "2"]
    one_line(argv, capsys, name, "overflows float32")


def test_extract_lora_refuses_factors_that_overflow_their_dtype(
    pair: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, model = pair
    scale(base, "layers.0.mlp.down_proj", 1e30)
    name = scale(model, "layers.0.mlp.down_proj", 1e30)
    argv = ["extract-lora", str(model), "--base", str(base), "-o", str(tmp_path / "ad"), "--rank", "2"]
    one_line([*argv, "--dtype", "float16"], capsys, name, "NaN or Inf in float16")
    assert not (tmp_path / "ad").exists()


# --------------------------------------------------------------------------- moe and convert


@pytest.fixture
def family(tmp_path: Path) -> tuple[Path, list[Path], Path]:
    base, agents = df.family(tmp_path / "fam", "llama", 2)
    static = shutil.copytree(base, tmp_path / "static")
    return base, agents, static


def _moe(base: Path, agents: list[Path], static: Path, out: Path, tmp: Path) -> list[str]:
    argv = ["moe", str(base), "-o", str(out), "--static", str(static), "--quiet"]
    for i, a in enumerate(agents):
        prompts = tmp / f"p{i}.txt"
        prompts.write_text("\n".join(df.PROMPTS[i]) + "\n")
        argv += ["--model", str(a), "--prompts", str(prompts)]
    return argv


@pytest.mark.parametrize(
    ("who", "part", "value"),
    [("agent", "mlp.gate_proj", math.nan), ("agent", "mlp.down_proj", math.inf), ("static", "self_attn.q_proj",
     math.nan), ("static", "norm.weight", -math.inf), ("static", "embed", math.nan)],
)  # fmt: skip
def test_moe_refuses_non_finite_experts_and_static_merges(
    family: tuple[Path, list[Path], Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    who: str,
    part: str,
    value: float,
) -> None:
    base, agents, static = family
    name = poison(agents[1] if who == "agent" else static, part, value)
    out = tmp_path / "moe"
    one_line(_moe(base, agents, static, out, tmp_path), capsys, name, "NaN or Inf")
    assert not out.exists()


def test_moe_with_finite_inputs_still_builds(family: tuple[Path, list[Path], Path], tmp_path: Path) -> None:
    base, agents, static = family
    assert main(_moe(base, agents, static, tmp_path / "moe", tmp_path)) == 0
    strict(tmp_path / "moe" / "merge.json")


def test_convert_refuses_non_finite_sources(
    family: tuple[Path, list[Path], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, agents, _ = family
    name = poison(agents[0], "mlp.up_proj", math.nan, (1, 2))
    one_line(["convert", str(agents[0]), str(tmp_path / "out")], capsys, name, "NaN or Inf")
    assert not (tmp_path / "out").exists()


def test_the_rule_names_the_element() -> None:
    from agentmerge.errors import CheckpointError
    from agentmerge.io.guards.finite import check_finite

    values = torch.zeros(10)
    assert check_finite("f: t", values) is values
    values[7] = math.nan
    with pytest.raises(CheckpointError, match=r"^f: t: element 107 is nan"):
        check_finite("f: t", values, 100)
    assert check_finite("ints", torch.arange(3)).tolist() == [0, 1, 2]
