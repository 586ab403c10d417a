"""The hostile-input audit (issue 11): one test per hole it found. Each failed before its fix.

Data loss, broken models written with exit status 0, mergekit configs meaning something else, hangs from
config files, tracebacks instead of one line, parser disagreement with the safetensors library, and
SIGTERM leftovers.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors import safe_open
from safetensors.torch import save_file

from agentmerge import MergeConfig, ModelSpec, merge
from agentmerge.cli import main
from agentmerge.config.mergekit import from_mergekit
from agentmerge.config.schema import config_from_dict, load_config
from agentmerge.errors import AgentMergeError, CheckpointError, ConfigError, MergeError
from agentmerge.io.formats.checkpoint import Checkpoint
from agentmerge.io.formats.roles import FISHER_MARK
from agentmerge.io.formats.tensorfile import read_safetensors_header
from agentmerge.io.guards.safety import TMP_MARKER, output_lock

SHAPES = {"embed.weight": (16, 8), "layers.0.mlp.weight": (8, 8), "layers.0.norm.weight": (8,)}


@pytest.fixture(autouse=True)
def _private_hash_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTMERGE_CACHE", str(tmp_path.parent / f"{tmp_path.name}-hash-cache"))


def make_model(folder: Path, seed: int, *, scale: float = 1.0, tokenizer: bool = False) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    tensors = {n: (scale * torch.randn(s, generator=g)).bfloat16() for n, s in SHAPES.items()}
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}))
    if tokenizer:
        (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 8}))
    return folder


def digest(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture
def family(tmp_path: Path) -> tuple[Path, Path, Path]:
    return (
        make_model(tmp_path / "base", 0, tokenizer=True),
        make_model(tmp_path / "a", 1),
        make_model(tmp_path / "b", 2),
    )


def cfg_for(base: Path, *models: Path, method: str = "ram", **kw: object) -> MergeConfig:
    return MergeConfig(method=method, base=str(base), models=[ModelSpec(path=str(m)) for m in models], **kw)  # type: ignore[arg-type]


def one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str], needle: str, status: int = 2) -> str:
    assert main(argv) == status
    err = capsys.readouterr().err.strip()
    assert err.startswith("agentmerge: "), err
    assert "\n" not in err and "Traceback" not in err, err
    assert needle in err, err
    return err


def flags(base: Path, *models: Path, method: str = "ram") -> list[str]:
    return [
        "merge",
        "--method",
        method,
        "--base",
        str(base),
        "--quiet",
        *[x for m in models for x in ("--model", str(m))],
    ]


# --------------------------------------------------------------------------- data loss


def test_force_never_deletes_the_tokenizer_source(tmp_path: Path, family: tuple[Path, Path, Path]) -> None:
    base, a, b = family
    tok = make_model(tmp_path / "tok", 9, tokenizer=True)
    before = digest(tok)
    cfg = cfg_for(base, a, b, tokenizer_source=str(tok))
    for out in (tok, tmp_path):  # the tokenizer folder itself, and a parent of it
        with pytest.raises(AgentMergeError, match="must not be, contain or lie inside"):
            merge(cfg, out, force=True, quiet=True)
        with pytest.raises(AgentMergeError, match="must not be, contain or lie inside"):
            merge(cfg, out, force_any=True, quiet=True)
    assert digest(tok) == before


def test_force_never_deletes_a_fisher_folder(tmp_path: Path, family: tuple[Path, Path, Path]) -> None:
    base, a, b = family
    fisher = tmp_path / "fishers" / "fa"
    fisher.mkdir(parents=True)
    save_file({n: torch.ones(s) for n, s in SHAPES.items()}, fisher / "model.safetensors", metadata=dict([FISHER_MARK]))
    before = digest(fisher)
    models = [ModelSpec(path=str(m), fisher=str(fisher)) for m in (a, b)]
    cfg = MergeConfig(method="fisher", base=str(base), models=models)
    with pytest.raises(AgentMergeError, match="must not be, contain or lie inside"):
        merge(cfg, tmp_path / "fishers", force=True, quiet=True)
    assert digest(fisher) == before


def test_force_never_deletes_the_working_directory(
    tmp_path: Path, family: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    base, a, b = family
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("mine")
    monkeypatch.chdir(work)
    for flag in ("--force", "--force-any"):
        one_line_error(capsys, [*flags(base, a, b), "-o", ".", flag], "current directory")
        one_line_error(capsys, [*flags(base, a, b), "-o", "..", flag], "current directory")
    assert (work / "notes.txt").read_text() == "mine"


def test_force_replaces_only_an_earlier_merge_output(tmp_path: Path, family: tuple[Path, Path, Path]) -> None:
    base, a, b = family
    out = tmp_path / "out"
    merge(cfg_for(base, a, b), out, quiet=True)
    (out / "my-notes.txt").write_text("keep me")
    with pytest.raises(CheckpointError, match="did not write"):
        merge(cfg_for(base, a, b, method="linear"), out, force=True, quiet=True)
    assert (out / "my-notes.txt").read_text() == "keep me"
    (out / "my-notes.txt").unlink()
    merge(cfg_for(base, a, b, method="linear"), out, force=True, quiet=True)
    assert json.loads((out / "merge.json").read_text())["config"]["method"] == "linear"


def test_probe_reports_never_overwrite_inputs(
    tmp_path: Path, family: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    base, a, b = family
    before = {str(f): digest(f) for f in family}
    argv = ["probe", "--base", str(base), str(a), str(b), "--quiet"]
    for flag in ("--json", "--markdown", "--plot"):
        for target in (a / "model.safetensors", base / "config.json", b / "new-report.txt"):
            one_line_error(capsys, [*argv, flag, str(target)], "must not write inside input")
    assert {str(f): digest(f) for f in family} == before
    assert main([*argv, "--json", str(tmp_path / "r.json")]) == 0
    assert json.loads((tmp_path / "r.json").read_text())["models"] == [str(a), str(b)]
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".r.json")]  # written via a renamed temp


def _tiny_lm(folder: Path) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny_lms(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("lms")
    return [_tiny_lm(root / f"lm{i}") for i in range(2)]


def test_fisher_output_is_atomic_marked_and_kept_out_of_inputs(
    tmp_path: Path, tiny_lms: list[Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    lm = tmp_path / "lm"
    lm.mkdir()
    for f in tiny_lms[0].iterdir():
        (lm / f.name).write_bytes(f.read_bytes())
    before = digest(lm)
    one_line_error(capsys, ["fisher", str(lm), "--samples", "1", "--max-tokens", "2", "--out", str(lm)], "must not be")
    assert digest(lm) == before
    # a run that dies half-way leaves nothing that looks like a Fisher
    from agentmerge.io.output import writer

    calls = {"n": 0}
    real_write = writer.ShardWriter.write

    def dying_write(self: writer.ShardWriter, name: str, start: int, values: torch.Tensor) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        real_write(self, name, start, values)

    monkeypatch.setattr(writer.ShardWriter, "write", dying_write)
    out = tmp_path / "fisher"
    assert main(["fisher", str(lm), "--samples", "1", "--max-tokens", "2", "--out", str(out)]) == 130
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".fisher.")]
    monkeypatch.setattr(writer.ShardWriter, "write", real_write)
    assert main(["fisher", str(lm), "--samples", "1", "--max-tokens", "2", "--out", str(out)]) == 0
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert f.metadata()[FISHER_MARK[0]] == FISHER_MARK[1]
    # a Fisher given as a model, and a model given as a Fisher, are refused
    other = tiny_lms[1]
    with pytest.raises(CheckpointError, match="is a Fisher file"):
        merge(
            MergeConfig(method="linear", models=[ModelSpec(path=str(out)), ModelSpec(path=str(other))]), tmp_path / "x"
        )
    models = [ModelSpec(path=str(lm), fisher=str(other)), ModelSpec(path=str(other), fisher=str(out))]
    with pytest.raises(CheckpointError, match="not a Fisher file"):
        merge(MergeConfig(method="fisher", models=models), tmp_path / "y", quiet=True)


def test_a_second_merge_into_the_same_output_waits_its_turn(tmp_path: Path, family: tuple[Path, Path, Path]) -> None:
    base, a, b = family
    out = tmp_path / "out"
    with output_lock(out.resolve()):  # another run is writing this output right now
        with pytest.raises(CheckpointError, match="another agentmerge run"):
            merge(cfg_for(base, a, b), out, quiet=True)
        assert not out.exists()
    merge(cfg_for(base, a, b), out, quiet=True)
    assert (out / "merge.json").exists() and not [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.")]


def test_two_concurrent_merges_one_output_one_winner(tmp_path: Path, family: tuple[Path, Path, Path]) -> None:
    base, a, b = family
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "agentmerge", *flags(base, a, b)[:], "-o", str(out), "--max-shard-size", "1KB"]
    procs = [subprocess.Popen(argv, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    results = [(p.wait(), p.stderr.read() if p.stderr else "") for p in procs]
    ok = [r for r in results if r[0] == 0]
    assert len(ok) == 1, results  # without the lock, two could pass the emptiness check and both "succeed"
    for code, err in results:  # every other run failed loudly: busy output, or already written
        assert code in (0, 2), err
        if code == 2:
            assert "another agentmerge run" in err or "exists and is not empty" in err, err


# --------------------------------------------------------------------------- broken models written with status 0


@pytest.mark.parametrize(
    ("weights", "needle"),
    [
        ([float("nan"), 1.0], "finite"),
        ([float("inf"), 1.0], "finite"),
        ([-float("inf"), 1.0], "finite"),
        ([1e300, 1.0], "out of range"),
        ([1.0, -1.0 + 1e-12], "nearly zero"),
    ],
)
def test_bad_weights_are_refused(family: tuple[Path, Path, Path], weights: list[float], needle: str) -> None:
    base, a, b = family
    models = [{"path": str(m), "weight": w} for m, w in zip((a, b), weights, strict=True)]
    with pytest.raises(ConfigError, match=needle):
        config_from_dict({"method": "linear", "base": str(base), "models": models})


@pytest.mark.parametrize("dtype", ["bool", "int8", "I8", "I64", "U8", "F8_E4M3", "F8_E5M2"])
def test_only_floating_output_dtypes(family: tuple[Path, Path, Path], dtype: str) -> None:
    base, a, b = family
    with pytest.raises(ConfigError, match=r"not a floating type|unknown dtype"):
        config_from_dict(
            {"method": "ram", "base": str(base), "models": [{"path": str(a)}, {"path": str(b)}], "dtype": dtype}
        )


@pytest.mark.parametrize(
    ("method", "params", "dtype"),
    [
        ("task_arithmetic", {"lambda": 1e38}, None),
        ("ties", {"lambda": 1e38, "density": 0.5}, None),
        ("dare_linear", {"lambda": 1e38, "p": 0.1}, None),
        ("task_arithmetic", {"lambda": 1e5}, "float16"),
    ],
)
def test_overflowing_merge_fails_naming_the_tensor(
    tmp_path: Path, family: tuple[Path, Path, Path], method: str, params: dict[str, float], dtype: str | None
) -> None:
    base, a, b = family
    cfg = config_from_dict(
        {
            "method": method,
            "base": str(base),
            "models": [{"path": str(a)}, {"path": str(b)}],
            "params": params,
            "dtype": dtype,
        }
    )
    with pytest.raises(MergeError, match=r"tensor '.*'.*NaN or Inf"):
        merge(cfg, tmp_path / "out", quiet=True)
    assert not (tmp_path / "out").exists()


def test_tokenizer_source_must_hold_a_tokenizer(tmp_path: Path, family: tuple[Path, Path, Path]) -> None:
    base, a, b = family
    cases = [(tmp_path / "nope", "no such file"), (a, "holds no tokenizer"), ("someone/tokenizer-repo", "")]
    for source, needle in cases:
        with pytest.raises(AgentMergeError, match=needle):
            merge(cfg_for(base, a, b, tokenizer_source=str(source)), tmp_path / "out", quiet=True)
        assert not (tmp_path / "out").exists()


def test_mistyped_local_path_is_not_a_hub_id(
    tmp_path: Path, family: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    base, a, _ = family
    (tmp_path / "models").mkdir()
    make_model(tmp_path / "models" / "agent0", 3)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(CheckpointError, match=r"mdoels/agent0: no such file or folder \(did you mean 'models/agent0'"):
        merge(cfg_for(base, a, Path("mdoels/agent0")), tmp_path / "out", quiet=True)
    with pytest.raises(CheckpointError, match="did you mean"):
        Checkpoint("./models/agnet0")


# --------------------------------------------------------------------------- mergekit defaults


@pytest.mark.parametrize(
    ("method", "expect", "needle"),
    [
        ("ties", {"density": 1.0}, "density = 1.0"),
        ("dare_ties", {"p": 0.0}, "density = 1.0"),
        ("dare_linear", {"p": 0.0}, "density = 1.0"),
        ("breadcrumbs", {"density": 1.0, "gamma": 0.0}, "does not sparsify"),
        ("della", {"p": 0.0, "eps": 0.0}, "does not prune"),
    ],
)
def test_mergekit_defaults_are_mergekits(
    family: tuple[Path, Path, Path], method: str, expect: dict[str, float], needle: str
) -> None:
    base, a, b = family
    doc = {"merge_method": method, "base_model": str(base), "models": [{"model": str(a)}, {"model": str(b)}]}
    conv = from_mergekit(doc)
    assert {k: conv.config["params"][k] for k in expect} == expect
    assert any(needle in n for n in conv.notes), conv.notes
    config_from_dict(conv.config)  # and it is a valid config


def test_mergekit_della_epsilon_default_and_explicit_breadcrumbs_density_one(family: tuple[Path, Path, Path]) -> None:
    base, a, b = family
    models = [{"model": str(a)}, {"model": str(b)}]
    della = from_mergekit(
        {"merge_method": "della", "base_model": str(base), "models": models, "parameters": {"density": 0.5}}
    )
    assert della.config["params"] == {"p": 0.5, "eps": 0.3}  # mergekit's epsilon 0.15 (half-width) = our spread 0.3
    assert any("epsilon = 0.15" in n for n in della.notes)
    crumbs = {"merge_method": "breadcrumbs", "base_model": str(base), "models": models, "parameters": {"density": 1.0}}
    config_from_dict(from_mergekit(crumbs).config)  # accepted: mergekit does not sparsify at density 1


def test_convert_config_states_the_defaults(
    tmp_path: Path, family: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    base, a, b = family
    doc = {"merge_method": "ties", "base_model": str(base), "models": [{"model": str(a)}, {"model": str(b)}]}
    (tmp_path / "mk.yaml").write_text(yaml.safe_dump(doc))
    assert main(["convert-config", str(tmp_path / "mk.yaml")]) == 0
    out = capsys.readouterr().out
    assert "# note: density not given: mergekit's default density = 1.0 filled in" in out


def test_mergekit_ties_without_density_equals_mergekits_meaning(
    tmp_path: Path, family: tuple[Path, Path, Path]
) -> None:
    base, a, b = family
    doc = {"merge_method": "ties", "base_model": str(base), "models": [{"model": str(a)}, {"model": str(b)}]}
    (tmp_path / "mk.yaml").write_text(yaml.safe_dump(doc))
    assert main(["merge", str(tmp_path / "mk.yaml"), str(tmp_path / "mk"), "--quiet"]) == 0
    merge(cfg_for(base, a, b, method="ties", params={"density": 1.0}), tmp_path / "native", quiet=True)
    assert (tmp_path / "mk" / "model.safetensors").read_bytes() == (
        tmp_path / "native" / "model.safetensors"
    ).read_bytes()


# --------------------------------------------------------------------------- config bounds


def test_yaml_alias_bomb_is_refused_quickly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    lines += ["merge_method: ties", "base_model: *a8", "models: [{model: m}]"]
    (tmp_path / "bomb.yaml").write_text("\n".join(lines) + "\n")
    t0 = time.perf_counter()
    err = one_line_error(capsys, ["merge", str(tmp_path / "bomb.yaml"), str(tmp_path / "out")], "expands to more")
    assert time.perf_counter() - t0 < 10 and len(err) < 400
    (tmp_path / "self.yaml").write_text("a: &a [1, *a]\nmethod: ram\n")
    with pytest.raises(ConfigError):
        load_config(tmp_path / "self.yaml")


def test_oversized_config_is_refused_before_parsing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "big.yaml"
    with open(path, "w") as f:
        f.write("method: ram\nexclude:\n")
        for i in range(400_000):
            f.write(f"  - layers.{i}.weight\n")
    t0 = time.perf_counter()
    one_line_error(capsys, ["merge", str(path), str(tmp_path / "out")], "too large for a config")
    assert time.perf_counter() - t0 < 5


def test_config_is_parsed_once(
    tmp_path: Path, family: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    base, a, b = family
    calls = []
    real = yaml.safe_load
    monkeypatch.setattr(yaml, "safe_load", lambda text: calls.append(1) or real(text))
    for doc in (
        {"method": "ram", "base": str(base), "models": [{"path": str(a)}, {"path": str(b)}]},
        {"merge_method": "linear", "models": [{"model": str(a)}, {"model": str(b)}]},
    ):
        calls.clear()
        (tmp_path / "c.yaml").write_text(yaml.safe_dump(doc))
        assert main(["merge", str(tmp_path / "c.yaml"), str(tmp_path / f"out{len(doc)}"), "--quiet", "--dry-run"]) == 0
        assert len(calls) == 1


def test_include_exclude_matching_is_linear(family: tuple[Path, Path, Path]) -> None:
    base, a, b = family
    exclude = [f"model.layers.{i}.mlp.weight" for i in range(20_000)] + ["*norm*", "lm_head.?eight"]
    cfg = config_from_dict(
        {"method": "ram", "base": str(base), "models": [{"path": str(a)}, {"path": str(b)}], "exclude": exclude}
    )
    names = [f"model.layers.{i}.self_attn.q_proj.weight" for i in range(2_000)] + ["model.layers.7.mlp.weight"]
    t0 = time.perf_counter()
    chosen = [cfg.selected(n) for n in names]
    assert time.perf_counter() - t0 < 1.0
    assert all(chosen[:-1]) and not chosen[-1]
    assert not cfg.selected("x.norm.weight") and not cfg.selected("lm_head.weight") and cfg.selected("lm_head.bias")


# --------------------------------------------------------------------------- one line instead of a traceback


def _raw_st(path: Path, header: bytes, data: bytes = b"") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return path


def _with_config(folder: Path, text: str) -> Path:
    make_model(folder, 5)
    (folder / "config.json").write_text(text)
    return folder


def _nested_index(folder: Path) -> Path:
    make_model(folder, 5)
    (folder / "model.safetensors").rename(folder / "model-00001-of-00001.safetensors")
    (folder / "model.safetensors.index.json").write_text("[" * 100_000 + "]" * 100_000)
    return folder


def _dir_named_weights(folder: Path) -> Path:
    (folder / "model.safetensors").mkdir(parents=True)
    return folder


BAD_MODELS = {
    "nested-header": (lambda f: _raw_st(f / "model.safetensors", b"[" * 100_000 + b"]" * 100_000).parent, "nested"),
    "5000-digit-int": (
        lambda f: _raw_st(f / "model.safetensors", b'{"t": {"dtype": "F32", "shape": [' + b"9" * 5000 + b"]}}").parent,
        "not valid JSON",
    ),
    "nested-config": (lambda f: _with_config(f, "[" * 100_000 + "]" * 100_000), "nested"),
    "config-is-a-list": (lambda f: _with_config(f, "[1, 2]"), "must be a JSON object"),
    "nested-index": (_nested_index, "nested"),
    "folder-named-model.safetensors": (_dir_named_weights, "is a folder"),
}


@pytest.mark.parametrize("case", sorted(BAD_MODELS))
def test_bad_model_folders_give_one_line(
    tmp_path: Path, family: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str], case: str
) -> None:
    base, a, _ = family
    build, needle = BAD_MODELS[case]
    bad = build(tmp_path / "bad")
    for argv in (
        [*flags(base, a, bad), "-o", str(tmp_path / "out")],
        [*flags(base, a, bad), "-o", str(tmp_path / "out"), "--dry-run"],
        ["probe", "--base", str(base), str(a), str(bad), "--quiet"],
    ):
        one_line_error(capsys, argv, needle)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("method: ram\nseed: " + "9" * 5000 + "\n", "not a valid config value"),
        (b"method: r\xe4m\n", "not UTF-8"),
        ("method: ram\n".encode("utf-16"), "not UTF-8"),
        ("method: ram\nmodels: " + "[" * 5000 + "]" * 5000 + "\n", ""),
    ],
)
def test_bad_yaml_gives_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str | bytes, needle: str
) -> None:
    path = tmp_path / "c.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    one_line_error(capsys, ["merge", str(path), str(tmp_path / "out")], needle)
    one_line_error(capsys, ["convert-config", str(path)], needle)


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--param", "r=" + "9" * 400], "sensible size"),
        (["--param", "r=" + "9" * 5000], "finite"),
        (["--weights", "1,abc"], "--weights: value 2"),
    ],
)
def test_bad_numbers_on_the_command_line(
    tmp_path: Path, family: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str], extra: list[str], needle: str
) -> None:
    base, a, b = family
    method = "linear" if "--weights" in extra else "ram_plus"
    one_line_error(capsys, [*flags(base, a, b, method=method), "-o", str(tmp_path / "out"), *extra], needle)


def test_agent_inf_and_huge_r_in_yaml(
    tmp_path: Path, family: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    base, a, b = family
    for params in ("{agent: .inf}", "{r: " + "9" * 400 + "}"):
        method = "unique_only" if "agent" in params else "ram_plus"
        text = f"method: {method}\nbase: {base}\nmodels: [{a}, {b}]\nparams: {params}\n"
        (tmp_path / "c.yaml").write_text(text)
        one_line_error(capsys, ["merge", str(tmp_path / "c.yaml"), str(tmp_path / "out")], "sensible size")


def test_read_only_output_parent(
    tmp_path: Path, family: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    base, a, b = family
    locked = tmp_path / "locked"
    locked.mkdir()
    real_mkdir, real_access = Path.mkdir, os.access

    def mkdir(self: Path, *args: object, **kw: object) -> None:
        if locked in self.parents:
            raise PermissionError(13, "Permission denied", str(self))
        real_mkdir(self, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "mkdir", mkdir)  # as a non-root user with chmod 555 (root ignores modes)
    monkeypatch.setattr(os, "access", lambda p, mode: Path(p) != locked and real_access(p, mode))
    out = locked / "out"
    one_line_error(capsys, [*flags(base, a, b), "-o", str(out)], "Permission denied")
    one_line_error(capsys, [*flags(base, a, b), "-o", str(out), "--dry-run"], "permission denied")
    assert list(locked.iterdir()) == []


def test_probe_parameters_are_checked_as_merge_checks_them(
    tmp_path: Path, family: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    base, a, b = family
    argv = ["probe", "--base", str(base), str(a), str(b), "--quiet"]
    for extra, needle in (
        (["--epsilon", "nan"], "finite"),
        (["--epsilon", "-1"], "out of range"),
        (["--r", "nan"], "finite"),
        (["--alpha", "-2"], "out of range"),
        (["--threads", "-1"], "at least 1"),
        (["--threads", "0"], "at least 1"),
        (["--json", str(tmp_path / "missing" / "r.json")], "does not exist"),
        (["--markdown", str(tmp_path)], "names a folder"),
    ):
        one_line_error(capsys, [*argv, *extra], needle)


def test_fisher_counts_and_bad_models(
    tmp_path: Path, tiny_lms: list[Path], family: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    lm = tiny_lms[0]
    out = str(tmp_path / "f")
    one_line_error(capsys, ["fisher", str(lm), "--samples", "0", "--out", out], "--samples must be at least 1")
    one_line_error(capsys, ["fisher", str(lm), "--max-tokens", "0", "--out", out], "--max-tokens must be at least 1")
    no_config = tmp_path / "noconf"
    make_model(no_config, 1)
    (no_config / "config.json").unlink()
    bad_type = _with_config(tmp_path / "badtype", json.dumps({"model_type": "no-such-model"}))
    garbage_cfg = _with_config(tmp_path / "garbage", json.dumps({"model_type": "qwen2", "hidden_size": "big"}))
    for model, needle in (
        (tmp_path / "missing", "no such file"),
        (family[1], "does not match its weights"),  # a config without sizes: transformers' 12B default
        (no_config, "cannot"),
        (bad_type, "cannot"),
        (garbage_cfg, "cannot"),
        (_dir_named_weights(tmp_path / "dirweights"), "is a folder"),
    ):
        one_line_error(capsys, ["fisher", str(model), "--samples", "1", "--max-tokens", "2", "--out", out], needle)
    assert not (tmp_path / "f").exists()


def test_ctrl_c_is_one_line(
    tmp_path: Path, family: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    base, a, b = family
    merge_module = sys.modules["agentmerge.engine.merge"]

    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(merge_module, "write_pass", interrupted)
    out = tmp_path / "out"
    one_line_error(capsys, [*flags(base, a, b), "-o", str(out)], "interrupted", status=130)
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]


# --------------------------------------------------------------------------- parser agreement


ENTRY = b'{"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}'
LIBRARY_ACCEPTS = {"duplicate-name", "leading-space"}  # this safetensors build takes them; ambiguous, so we refuse
DISAGREEMENTS = {
    "duplicate-name": (b'{"t": ' + ENTRY + b', "t": ' + ENTRY + b"}", b"\0" * 8, "appears twice"),
    "utf-16": (('{"t": ' + ENTRY.decode() + "}").encode("utf-16"), b"\0" * 8, "not valid JSON"),
    "utf-16-le": (('{"t": ' + ENTRY.decode() + "}").encode("utf-16-le"), b"\0" * 8, "not valid JSON"),
    "trailing-bytes": (b'{"t": ' + ENTRY + b"}", b"\0" * 12, "trailing bytes"),
    "gap": (b'{"t": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}', b"\0" * 12, "belong to no tensor"),
    "metadata-not-strings": (b'{"__metadata__": {"format": 1}, "t": ' + ENTRY + b"}", b"\0" * 8, "__metadata__"),
    "metadata-a-list": (b'{"__metadata__": ["pt"], "t": ' + ENTRY + b"}", b"\0" * 8, "__metadata__"),
    "leading-space": (b' {"t": ' + ENTRY + b"}", b"\0" * 8, "must start with"),
}


@pytest.mark.parametrize("case", sorted(DISAGREEMENTS))
def test_header_parser_agrees_with_safetensors(tmp_path: Path, case: str) -> None:
    header, data, needle = DISAGREEMENTS[case]
    path = _raw_st(tmp_path / "model.safetensors", header, data)
    if case not in LIBRARY_ACCEPTS:
        with pytest.raises(Exception), safe_open(str(path), "pt") as f:  # noqa: B017 - the library refuses it too
            [f.get_tensor(k) for k in f.keys()]  # noqa: SIM118
    with pytest.raises(CheckpointError, match=needle):
        read_safetensors_header(path)


def test_header_parser_still_accepts_what_safetensors_writes(tmp_path: Path) -> None:
    tensors = {"a": torch.ones(3, dtype=torch.bfloat16), "b": torch.zeros(2, 2), "c": torch.zeros(0)}
    save_file(tensors, tmp_path / "x.safetensors", metadata={"format": "pt", "k": "v"})
    infos = read_safetensors_header(tmp_path / "x.safetensors")
    assert {n: i.shape for n, i in infos.items()} == {"a": (3,), "b": (2, 2), "c": (0,)}


def test_index_with_a_stray_single_file_is_ambiguous(tmp_path: Path, family: tuple[Path, Path, Path]) -> None:
    base, a, _ = family
    both = make_model(tmp_path / "both", 4)
    (both / "model-00001-of-00001.safetensors").write_bytes((both / "model.safetensors").read_bytes())
    index = {"metadata": {}, "weight_map": dict.fromkeys(SHAPES, "model-00001-of-00001.safetensors")}
    (both / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="ambiguous"):
        merge(cfg_for(base, a, both), tmp_path / "out", quiet=True)


def test_top_level_weights_linked_outside_are_refused_like_shards(
    tmp_path: Path, family: tuple[Path, Path, Path]
) -> None:
    base, a, _ = family
    outside = make_model(tmp_path / "elsewhere", 7)
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "config.json").write_text((a / "config.json").read_text())
    (linked / "model.safetensors").symlink_to(outside / "model.safetensors")
    with pytest.raises(CheckpointError, match="links outside"):
        merge(cfg_for(base, a, linked), tmp_path / "out", quiet=True)


def test_old_non_zip_pickles_are_read_safely(tmp_path: Path, family: tuple[Path, Path, Path]) -> None:
    base, a, b = family
    old = tmp_path / "old"
    old.mkdir()
    (old / "config.json").write_text((b / "config.json").read_text())
    from safetensors.torch import load_file

    state = load_file(b / "model.safetensors")
    torch.save(state, old / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    merge(cfg_for(base, a, old), tmp_path / "from-old", quiet=True)
    merge(cfg_for(base, a, b), tmp_path / "from-st", quiet=True)
    assert (tmp_path / "from-old" / "model.safetensors").read_bytes() == (
        tmp_path / "from-st" / "model.safetensors"
    ).read_bytes()

    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, ("echo pwned",))

    with open(old / "pytorch_model.bin", "wb") as f:  # an old-format pickle with code in it is still refused
        pickle.dump({"embed.weight": Evil()}, f, protocol=2)
    with pytest.raises(CheckpointError, match="refused to load"):
        Checkpoint(old)


# --------------------------------------------------------------------------- SIGTERM and stale temporary folders


def test_sigterm_cleans_up_like_ctrl_c(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    names = {f"layers.{i}.weight": (256, 256) for i in range(24)}
    for k in range(3):
        folder = tmp_path / f"m{k}"
        folder.mkdir()
        save_file({n: torch.randn(s, generator=g) for n, s in names.items()}, folder / "model.safetensors")
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "agentmerge", "merge", "--method", "ties", "--base", str(tmp_path / "m0")]
    argv += ["--model", str(tmp_path / "m1"), "--model", str(tmp_path / "m2"), "-o", str(out), "--quiet"]
    argv += ["--chunk-size", "1024", "--threads", "1"]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not [p for p in tmp_path.iterdir() if p.name.startswith(".out.tmp-")]:
        assert proc.poll() is None and time.monotonic() < deadline, "the merge ended before it could be stopped"
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(60)
    err = proc.stderr.read() if proc.stderr else ""
    assert code == 128 + signal.SIGTERM, err
    assert "terminated" in err and "Traceback" not in err
    assert not out.exists() and not [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.")]


def test_merge_removes_stale_temp_folders_of_crashed_runs(tmp_path: Path, family: tuple[Path, Path, Path]) -> None:
    base, a, b = family
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".other-output.tmp-{dead.pid}-0123abcd"
    stale.mkdir()
    (stale / TMP_MARKER).write_bytes(b"")
    (stale / "model.safetensors").write_bytes(b"\0" * 1000)
    foreign = tmp_path / f".someone-else.tmp-{dead.pid}-0123abcd"  # not marked as ours: kept
    foreign.mkdir()
    live = tmp_path / f".busy.tmp-{os.getpid()}-0123abcd"  # its process is alive: kept
    live.mkdir()
    (live / TMP_MARKER).write_bytes(b"")
    merge(cfg_for(base, a, b), tmp_path / "out", quiet=True)
    assert not stale.exists() and foreign.exists() and live.exists()
    assert not (tmp_path / "out" / TMP_MARKER).exists()
