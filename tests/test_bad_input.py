"""Bad input: every case gives one clear error (an AgentMergeError naming the problem) and writes nothing.

"Writes nothing" means: the output folder does not exist afterwards and no hidden ``.NAME.tmp-*`` sibling
is left behind, and the inputs are byte-for-byte unchanged.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from agentmerge import MergeConfig, ModelSpec, config_from_dict, merge
from agentmerge.cli import main
from agentmerge.errors import AgentMergeError, CheckpointError, ConfigError, MergeError

SHAPES = {"embed.weight": (16, 8), "layers.0.mlp.weight": (8, 8), "layers.0.norm.weight": (8,)}


@pytest.fixture(autouse=True)
def _private_hash_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Input hashes are cached under the test's folder, not in the home directory."""
    monkeypatch.setenv("AGENTMERGE_CACHE", str(tmp_path.parent / f"{tmp_path.name}-hash-cache"))


def make_model(
    folder: Path,
    seed: int,
    *,
    arch: str = "Qwen2ForCausalLM",
    shapes: dict[str, tuple[int, ...]] | None = None,
    dtype: torch.dtype = torch.bfloat16,
) -> Path:
    """A small model folder: model.safetensors plus config.json."""
    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    tensors = {n: torch.randn(s, generator=g).to(dtype) for n, s in (shapes or SHAPES).items()}
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps({"architectures": [arch], "model_type": "qwen2"}))
    return folder


def tree_digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }


def assert_nothing_written(out: Path) -> None:
    assert not out.exists(), f"{out} was created"
    leftovers = [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]
    assert not leftovers, f"temporary siblings left: {leftovers}"


def run_expecting(
    tmp_path: Path, cfg: MergeConfig, error: type[AgentMergeError], needle: str, out_name: str = "out"
) -> str:
    """Merge, expect ``error`` whose message contains ``needle``; check nothing was written, inputs unchanged."""
    before = tree_digest(tmp_path)
    out = tmp_path / "outputs" / out_name
    out.parent.mkdir(exist_ok=True)
    with pytest.raises(error) as e:
        merge(cfg, out, quiet=True)
    msg = str(e.value)
    assert needle in msg, msg
    assert "\n" not in msg
    assert_nothing_written(out)
    assert tree_digest(tmp_path) == before
    return msg


@pytest.fixture
def family(tmp_path: Path) -> tuple[Path, Path, Path]:
    return make_model(tmp_path / "base", 0), make_model(tmp_path / "a", 1), make_model(tmp_path / "b", 2)


def cfg_for(base: Path, *models: Path, method: str = "ram", **params: object) -> MergeConfig:
    return MergeConfig(method=method, base=str(base), models=[ModelSpec(path=str(m)) for m in models], params=params)


def test_different_architectures(tmp_path: Path, family: tuple[Path, Path, Path]) -> None:
    base, a, _ = family
    other = make_model(tmp_path / "llama", 3, arch="LlamaForCausalLM")
    run_expecting(tmp_path, cfg_for(base, a, other), MergeError, "architecture")


@pytest.mark.parametrize("change", ["missing", "extra"])
def test_different_tensor_sets(tmp_path: Path, family: tuple[Path, Path, Path], change: str) -> None:
    base, a, _ = family
    shapes = dict(SHAPES)
    if change == "missing":
        del shapes["layers.0.norm.weight"]
    else:
        shapes["lm_head.weight"] = (16, 8)
    other = make_model(tmp_path / "odd", 3, shapes=shapes)
    msg = run_expecting(tmp_path, cfg_for(base, a, other), MergeError, "tensor sets differ")
    assert ("layers.0.norm.weight" if change == "missing" else "lm_head.weight") in msg


def test_shape_mismatch(tmp_path: Path, family: tuple[Path, Path, Path]) -> None:
    base, a, _ = family
    other = make_model(tmp_path / "wide", 3, shapes={**SHAPES, "embed.weight": (17, 8)})
    run_expecting(tmp_path, cfg_for(base, a, other), MergeError, "'embed.weight' has shape [17, 8]")


def test_fp32_agents_on_a_bf16_base_are_a_normal_input(tmp_path: Path, family: tuple[Path, Path, Path]) -> None:
    """Floating dtypes may differ (verl and ToolRL release fp32 agents of bf16 bases); the output keeps the base's."""
    base, a, _ = family
    other = make_model(tmp_path / "f32", 3, dtype=torch.float32)
    merge(cfg_for(base, a, other), tmp_path / "out", quiet=True)
    from safetensors.torch import load_file

    assert {t.dtype for t in load_file(tmp_path / "out" / "model.safetensors").values()} == {torch.bfloat16}


def test_integer_dtype_mismatch_is_refused(tmp_path: Path, family: tuple[Path, Path, Path]) -> None:
    base, a, _ = family
    other = make_model(tmp_path / "int", 3)
    from safetensors.torch import load_file

    t = load_file(other / "model.safetensors")
    name = next(iter(t))
    t[name] = t[name].to(torch.int32)
    save_file(t, other / "model.safetensors")
    run_expecting(tmp_path, cfg_for(base, a, other), MergeError, "torch.int32")


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("where", ["base", "model"])
def test_non_finite_values(tmp_path: Path, family: tuple[Path, Path, Path], bad: float, where: str) -> None:
    base, a, b = family
    victim = make_model(tmp_path / "victim", 4)
    from safetensors.torch import load_file

    t = load_file(victim / "model.safetensors")
    t["layers.0.mlp.weight"][3, 5] = bad
    save_file(t, victim / "model.safetensors")
    cfg = cfg_for(victim, a, b) if where == "base" else cfg_for(base, a, victim)
    msg = run_expecting(tmp_path, cfg, MergeError, "NaN or Inf")
    assert "victim" in msg and "layers.0.mlp.weight" in msg


def _corrupt(kind: str) -> Callable[[Path], None]:
    def truncate(f: Path) -> None:
        data = f.read_bytes()
        f.write_bytes(data[: len(data) - 10])

    def garbage_header(f: Path) -> None:
        data = bytearray(f.read_bytes())
        data[8:12] = b"\xff\xfe{["
        f.write_bytes(bytes(data))

    def huge_header_length(f: Path) -> None:
        data = f.read_bytes()
        f.write_bytes(struct.pack("<Q", 2**62) + data[8:])

    def tiny_file(f: Path) -> None:
        f.write_bytes(b"\x01\x02")

    return {"truncated": truncate, "garbage": garbage_header, "huge": huge_header_length, "tiny": tiny_file}[kind]


@pytest.mark.parametrize(
    ("kind", "needle"),
    [("truncated", "truncated"), ("garbage", "not valid JSON"), ("huge", "header length"), ("tiny", "too short")],
)
def test_truncated_or_corrupt_file(tmp_path: Path, family: tuple[Path, Path, Path], kind: str, needle: str) -> None:
    base, a, _ = family
    broken = make_model(tmp_path / "broken", 5)
    _corrupt(kind)(broken / "model.safetensors")
    msg = run_expecting(tmp_path, cfg_for(base, a, broken), CheckpointError, needle)
    assert "broken" in msg


def _sharded(folder: Path, weight_map: dict[str, str]) -> Path:
    """Two shards: embed in shard 1, the rest in shard 2, and the given index."""
    folder.mkdir(parents=True)
    g = torch.Generator().manual_seed(7)
    t = {n: torch.randn(s, generator=g).to(torch.bfloat16) for n, s in SHAPES.items()}
    save_file({"embed.weight": t["embed.weight"]}, folder / "model-00001-of-00002.safetensors")
    save_file({k: v for k, v in t.items() if k != "embed.weight"}, folder / "model-00002-of-00002.safetensors")
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
    return folder


FULL_MAP = {
    "embed.weight": "model-00001-of-00002.safetensors",
    "layers.0.mlp.weight": "model-00002-of-00002.safetensors",
    "layers.0.norm.weight": "model-00002-of-00002.safetensors",
}


@pytest.mark.parametrize(
    ("weight_map", "needle"),
    [
        ({k: v for k, v in FULL_MAP.items() if k != "layers.0.norm.weight"}, "no matching entry"),
        ({**FULL_MAP, "ghost.weight": "model-00002-of-00002.safetensors"}, "listed but in no shard"),
        ({**FULL_MAP, "embed.weight": "model-00003-of-00002.safetensors"}, "listed but missing"),
        ({**FULL_MAP, "embed.weight": "../a/model.safetensors"}, "points outside"),
    ],
)
def test_index_problems(
    tmp_path: Path, family: tuple[Path, Path, Path], weight_map: dict[str, str], needle: str
) -> None:
    base, a, _ = family
    sharded = _sharded(tmp_path / "sharded", weight_map)
    run_expecting(tmp_path, cfg_for(base, a, sharded), CheckpointError, needle)


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"method": "ram_pluss"}, "did you mean 'ram_plus'"),
        ({"method": "ram_plus", "params": {"alfa": 1.0}}, "did you mean 'alpha'"),
        ({"method": "ram", "params": {"epsilon": -1.0}}, "out of range"),
        ({"method": "ram_plus", "params": {"r": "lots"}}, "must be a number"),
        ({"method": "ram_plus", "params": {"scope": "row"}}, "must be one of global, tensor, layer, module, pattern"),
        ({"method": "ram", "max_shard_size": "0GB"}, "must be positive"),
        ({"method": "ram", "dtype": "float13"}, "unknown dtype"),
        ({"method": "ram", "modles": []}, "did you mean 'models'"),
    ],
)
def test_config_errors_suggest_and_write_nothing(
    tmp_path: Path,
    family: tuple[Path, Path, Path],
    data: dict[str, object],
    needle: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    base, a, b = family
    full = {"base": str(base), "models": [{"path": str(a)}, {"path": str(b)}], **data}
    with pytest.raises(ConfigError, match=None) as e:
        config_from_dict(full)
    assert needle in str(e.value)
    # and through the command line: one line on stderr, exit code 2, nothing written
    (tmp_path / "c.yaml").write_text(json.dumps(full))
    out = tmp_path / "cli-out"
    assert main(["merge", str(tmp_path / "c.yaml"), str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("agentmerge: error:") and needle in err and "\n" not in err
    assert_nothing_written(out)


@pytest.mark.parametrize("where", ["inside-input", "is-input", "contains-input"])
def test_output_inside_an_input(tmp_path: Path, family: tuple[Path, Path, Path], where: str) -> None:
    base, a, b = family
    before = tree_digest(tmp_path)
    if where == "contains-input":
        nested = make_model(tmp_path / "outer" / "agent", 6)
        cfg, out = cfg_for(base, a, nested), tmp_path / "outer"
        before = tree_digest(tmp_path)
    else:
        cfg = cfg_for(base, a, b)
        out = a / "merged" if where == "inside-input" else a
    with pytest.raises(MergeError, match="must not be, contain or lie inside"):
        merge(cfg, out, quiet=True)
    if where == "inside-input":
        assert_nothing_written(out)
    assert tree_digest(tmp_path) == before


def test_missing_input_folder(tmp_path: Path, family: tuple[Path, Path, Path]) -> None:
    base, a, _ = family
    run_expecting(tmp_path, cfg_for(base, a, tmp_path / "nope"), CheckpointError, "no such file or folder")


def test_folder_without_weights(tmp_path: Path, family: tuple[Path, Path, Path]) -> None:
    base, a, _ = family
    (tmp_path / "empty").mkdir()
    run_expecting(tmp_path, cfg_for(base, a, tmp_path / "empty"), CheckpointError, "no weights found")
