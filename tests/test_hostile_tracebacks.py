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
from agentmerge.io.formats.checkpoint import Checkpoint
from agentmerge.io.formats.lora import LoraModel
from hostile import model_folder, one_line_error

transformers = pytest.importorskip("transformers")
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
    from agentmerge.methods.spherical.kernels import karcher_coefficients

    for g in ([[4.0, 6.0], [6.0, 9.0]], [[4.0, 0.0], [0.0, 0.0]], [[4.0, -6.0], [-6.0, 9.0]], [[1.0, 1.0], [1.0, 1.0]]):
        k = karcher_coefficients(torch.tensor(g, dtype=torch.float64), 10, 0.0)
        assert bool(torch.isfinite(k).all()), g
    g = torch.tensor([[4.0, 6.0], [6.0, 9.0]], dtype=torch.float64)  # y = 1.5 x, |x| = 2: the mean has length 2.5
    k = karcher_coefficients(g, 10, 0.0)
    assert float(k @ g @ k) == pytest.approx(2.5**2) and float(k @ g[0]) > 0


# --------------------------------------------------------------------------- moe


def moe_argv(family: Family, tmp_path: Path, prompts: tuple[str, str] = ("0123\n", "abc\n")) -> list[str]:
    """``moe BASE --model A0 --prompts P0 --model A1 --prompts P1 -o OUT --quiet`` with prompts files written."""
    base, agents = family
    argv = ["moe", str(base)]
    for i, (agent, text) in enumerate(zip(agents, prompts, strict=True)):
        (tmp_path / f"p{i}.txt").write_bytes(text.encode() if isinstance(text, str) else text)
        argv += ["--model", str(agent), "--prompts", str(tmp_path / f"p{i}.txt")]
    return [*argv, "-o", str(tmp_path / "out"), "--quiet"]


def moe_yaml(family: Family, tmp_path: Path, **extra: object) -> list[str]:
    base, agents = family
    experts = [{"path": str(a), "prompts": list(df.PROMPTS[i])} for i, a in enumerate(agents)]
    (tmp_path / "moe.yaml").write_text(yaml.safe_dump({"base": str(base), "experts": experts, **extra}))
    return ["moe", str(tmp_path / "moe.yaml"), "-o", str(tmp_path / "out"), "--quiet"]


@pytest.mark.parametrize(
    ("merge_section", "flags", "says"),
    [
        (["ram"], [], "'merge' must be a mapping"),
        ("ram", [], "'merge' must be a mapping"),
        ("ram", ["--method", "ties"], "'merge' must be a mapping"),
        ({"method": "ties", "params": ["k", 0.2]}, ["--param", "k=0.3"], "merge.params must be a mapping"),
        ({"method": "ties", "params": "k=0.2"}, ["--param", "k=0.3"], "merge.params must be a mapping"),
        ({"method": "ties", "params": ["k", 0.2]}, [], "merge.params must be a mapping"),
    ],
)
def test_moe_merge_section_of_the_wrong_kind_is_one_line(
    llama: Family,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    merge_section: object,
    flags: list[str],
    says: str,
) -> None:
    argv = moe_yaml(llama, tmp_path, merge=merge_section)
    for dry in ([], ["--dry-run"]):
        one_line_error([*argv, *flags, *dry], capsys, says, str(tmp_path / "moe.yaml"))
    nothing_written(tmp_path / "out")


@pytest.mark.parametrize(
    "content",
    [b"0123\n\xff\xfe\x00binary\n", bytes(range(256)) * 4, "0123\n".encode("utf-16")],
    ids=["bad-byte", "binary", "utf16"],
)
def test_moe_prompts_file_not_utf8_is_one_line(
    llama: Family, tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes
) -> None:
    argv = moe_argv(llama, tmp_path)
    (tmp_path / "p1.txt").write_bytes(content)
    for dry in ([], ["--dry-run"]):
        one_line_error([*argv, *dry], capsys, str(tmp_path / "p1.txt"), "UTF-8")
    (tmp_path / "p1.jsonl").write_bytes(b'{"prompt": "abc"}\n' + b"[" * 100_000 + b"\n")  # deeper than Python recurses
    argv[argv.index(str(tmp_path / "p1.txt"))] = str(tmp_path / "p1.jsonl")
    one_line_error(argv, capsys, "p1.jsonl:2", "not JSON")
    nothing_written(tmp_path / "out")


def no_merge(*args: object, **kwargs: object) -> None:
    raise AssertionError("the static merge ran before the prompts were checked")


def test_moe_chat_template_without_one_is_refused_before_the_merge(
    llama: Family, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    base = tmp_path / "base"
    shutil.copytree(llama[0], base)
    tok = transformers.AutoTokenizer.from_pretrained(base)
    tok.chat_template = None
    for name in ("tokenizer_config.json", "chat_template.jinja", "chat_template.json"):
        (base / name).unlink(missing_ok=True)
    tok.save_pretrained(base)
    monkeypatch.setattr("agentmerge.engine.merge.merge", no_merge)
    argv = moe_argv((base, llama[1]), tmp_path)
    for dry in ([], ["--dry-run"]):
        one_line_error([*argv, "--chat-template", *dry], capsys, str(base), "no chat template")
    nothing_written(tmp_path / "out")


def test_moe_token_id_beyond_the_embedding_is_refused_before_the_merge(
    llama: Family, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tokenizer with one token more than the embedding has rows (a tokenizer of another model)."""
    import shutil

    base = tmp_path / "base"
    shutil.copytree(llama[0], base)
    tok = transformers.AutoTokenizer.from_pretrained(base)
    rows = len(tok)
    tok.add_tokens(["QQQQ"])
    tok.save_pretrained(base)
    monkeypatch.setattr("agentmerge.engine.merge.merge", no_merge)
    argv = moe_argv((base, llama[1]), tmp_path, ("0123\n", "abQQQQc\n"))
    for dry in ([], ["--dry-run"]):
        one_line_error([*argv, *dry], capsys, str(base), f"token id {rows}", f"{rows} rows")
    nothing_written(tmp_path / "out")


# --------------------------------------------------------------------------- converge

RAISES = {
    "raises": "def score(folder):\n    raise RuntimeError('the grader broke\\nsecond line')\n",
    "divides": "def score(folder):\n    return {'m': 1 / 0}\n",
    "keyerror": "def score(folder):\n    return {}['m']\n",
}
BROKEN = {
    "syntax": ("def score(folder)\n    return {'m': 1.0}\n", ["SyntaxError", ":1:"]),
    "indent": ("def score(folder):\nreturn {'m': 1.0}\n", ["IndentationError", ":2:"]),
    "import-raises": (
        "raise ValueError('no GPU here')\ndef score(folder):\n    return {}\n",
        ["ValueError: no GPU here"],
    ),
    "import-missing": ("import not_a_module_anywhere\n", ["cannot import"]),
}


def converge_argv(tiny: Family, tmp_path: Path, module: str, code: str) -> list[str]:
    base, agents = tiny
    (tmp_path / f"{module}.py").write_text(code)
    argv = ["converge", str(base), str(agents[0]), "--evaluate", f"python:{module}:score", "--metric", "m"]
    return [*argv, "--scales", "1,1.5", "--quiet", "--json", str(tmp_path / "c.json")]


@pytest.mark.parametrize("case", sorted(RAISES))
def test_converge_evaluator_that_raises_is_one_line(
    tiny_family: Family,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    case: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    module = f"conv_raises_{case.replace('-', '_')}"
    argv = converge_argv(tiny_family, tmp_path, module, RAISES[case])
    line = one_line_error(argv, capsys, f"the evaluator python:{module}:score failed on", "at s = 1")
    assert {"raises": "RuntimeError: the grader broke", "divides": "ZeroDivisionError", "keyerror": "KeyError"}[
        case
    ] in line
    assert not (tmp_path / "c.json").exists()


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_converge_module_that_does_not_import_is_one_line(
    tiny_family: Family,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    case: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    module = f"conv_broken_{case.replace('-', '_')}"
    code, says = BROKEN[case]
    one_line_error(converge_argv(tiny_family, tmp_path, module, code), capsys, module, *says)
    assert not (tmp_path / "c.json").exists()


@pytest.mark.parametrize("flags", [["--threads", "0"], ["--threads", "-3"], ["--work", "MISSING"], ["--work", "FILE"]])
def test_converge_bad_work_or_threads_is_one_line(
    tiny_family: Family,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "FILE").write_text("not a folder")
    argv = converge_argv(tiny_family, tmp_path, "conv_fine", "def score(folder):\n    return {'m': 1.0}\n")
    flags = [str(tmp_path / f) if f in ("MISSING", "FILE") else f for f in flags]
    one_line_error([*argv, *flags], capsys, flags[0])
    assert (tmp_path / "FILE").read_text() == "not a folder" and not (tmp_path / "MISSING").exists()


def test_scaled_model_with_bad_threads_is_a_config_error(tiny_family: Family, tmp_path: Path) -> None:
    """The library path: pydantic's ValidationError escaped from a config built directly."""
    from agentmerge.errors import ConfigError
    from agentmerge.evaluation.convergence import scaled_model

    base, agents = tiny_family
    with pytest.raises(ConfigError, match="threads"):
        scaled_model(base, agents[0], 1.5, tmp_path / "s", threads=0)
    assert not (tmp_path / "s").exists()
