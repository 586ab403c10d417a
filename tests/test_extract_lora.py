"""``agentmerge extract-lora``: truncated SVDs as a PEFT adapter; exact at full rank, Eckart-Young below it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from agentmerge.cli import main
from agentmerge.engine.extract_lora import extract_lora
from agentmerge.io.formats.checkpoint import Checkpoint
from agentmerge.io.formats.lora import LoraModel
from agentmerge.methods.lowrank import choose_rank, factorize

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")
import densefamily as df  # noqa: E402


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def fam(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A base and one agent that changed every tensor (Qwen2: tied embeddings, attention biases)."""
    base, agents = df.family(tmp_path_factory.mktemp(str(request.param)), str(request.param), 1, other=0.02)
    return base, agents[0]


def deltas(base: Path, model: Path) -> dict[str, torch.Tensor]:
    with Checkpoint(base) as b, Checkpoint(model) as m:
        return {n: (m.read(n).float() - b.read(n).float()).view(i.shape) for n, i in b.tensors.items()}


def read_back(adapter: Path, base: Path) -> dict[str, torch.Tensor]:
    """Every tensor of base + adapter through agentmerge's own LoRA input."""
    with Checkpoint(base) as b, LoraModel(adapter, b) as lora:
        return {n: lora.read(n).view(i.shape) for n, i in b.tensors.items()}


def read_back_base(base: Path) -> dict[str, torch.Tensor]:
    with Checkpoint(base) as b:
        return {n: b.read(n).float().view(i.shape) for n, i in b.tensors.items()}


def peft_merged(adapter: Path, base: Path) -> dict[str, torch.Tensor]:
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    merged = peft.PeftModel.from_pretrained(model, adapter).merge_and_unload()
    return {k: v.detach() for k, v in merged.state_dict().items()}


# --------------------------------------------------------------------------- the math


@pytest.mark.parametrize("seed", range(5))
def test_energy_rank_is_the_smallest_that_keeps_the_share(seed: int) -> None:
    s = torch.rand(30, generator=torch.Generator().manual_seed(seed)).sort(descending=True).values
    for energy in (0.1, 0.5, 0.9, 0.99, 0.999999):
        r = choose_rank(s, energy=energy)
        power = [float(x) ** 2 for x in s]
        kept = [sum(power[:k]) / sum(power) for k in range(1, 31)]
        assert kept[r - 1] >= energy - 1e-12
        assert r == 1 or kept[r - 2] < energy
    assert choose_rank(s, energy=1.0) == 30 and choose_rank(s, rank=100) == 30 and choose_rank(s, rank=3) == 3


@pytest.mark.parametrize("rank", [1, 5, 17, 24])
def test_truncation_error_is_the_dropped_spectrum(rank: int) -> None:
    """Eckart-Young: ||dW - B A||_F^2 = sum of the dropped s_i^2 (reference: float64 singular values)."""
    delta = torch.randn(40, 24, generator=torch.Generator().manual_seed(rank))
    f = factorize(delta, rank=rank)
    s = torch.linalg.svdvals(delta.double())
    dropped = float((s[rank:] ** 2).sum())
    measured = float(((delta - f.b @ f.a).double() ** 2).sum())
    assert measured == pytest.approx(dropped, rel=1e-3, abs=1e-6)
    assert f.error == pytest.approx((dropped / float((s**2).sum())) ** 0.5, rel=1e-4, abs=1e-6)
    assert f.a.shape == (rank, 24) and f.b.shape == (40, rank)


# --------------------------------------------------------------------------- adapters of real layouts


def test_full_rank_round_trip_equals_the_model(fam: tuple[Path, Path], tmp_path: Path) -> None:
    """--energy 1.0: agentmerge's LoRA input and peft's merge_and_unload both give the model back."""
    base, model = fam
    result = extract_lora(model, base, tmp_path / "ad", energy=1.0)
    assert all(m.rank == m.max_rank for m in result.modules)
    plain, d = read_back_base(base), deltas(base, model)
    want = {n: plain[n] + d[n] for n in plain}
    ours, theirs = read_back(tmp_path / "ad", base), peft_merged(tmp_path / "ad", base)
    for name, w in want.items():
        assert torch.allclose(ours[name], w, atol=2e-6), name
        assert torch.allclose(theirs[name], w, atol=2e-6), name
    if "lm_head.weight" not in want:  # tied: peft keeps the head tied to the replaced embedding
        assert torch.equal(theirs["lm_head.weight"], theirs["model.embed_tokens.weight"])


def test_low_rank_is_within_the_truncation_bound(fam: tuple[Path, Path], tmp_path: Path) -> None:
    """--rank 2: each module's error is the spectrum it drops; peft's merge equals base + dW_r as we read it."""
    base, model = fam
    result = extract_lora(model, base, tmp_path / "ad", rank=2)
    d = deltas(base, model)
    ours, theirs = read_back(tmp_path / "ad", base), peft_merged(tmp_path / "ad", base)
    plain = read_back_base(base)
    for m in result.modules:
        name = f"{m.module}.weight"
        s = torch.linalg.svdvals(d[name].double())
        bound = float((s[2:] ** 2).sum())
        error = float(((ours[name] - plain[name] - d[name]).double() ** 2).sum())
        assert m.rank == 2 and error <= bound * (1 + 1e-3) + 1e-10 and error == pytest.approx(bound, rel=1e-2)
        assert m.error_stored == pytest.approx(m.error, rel=1e-3, abs=1e-6)
    for name in plain:
        assert torch.allclose(theirs[name], ours[name], atol=2e-6), name
    cfg = json.loads((tmp_path / "ad" / "adapter_config.json").read_text())
    assert cfg["r"] == 2 and cfg["lora_alpha"] == 2 and cfg["modules_to_save"]


def test_energy_ranks_in_the_rank_pattern(fam: tuple[Path, Path], tmp_path: Path) -> None:
    base, model = fam
    result = extract_lora(model, base, tmp_path / "ad", energy=0.9)
    d = deltas(base, model)
    loaded = peft.PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(base), tmp_path / "ad")
    modules = dict(loaded.base_model.model.named_modules())
    for m in result.modules:
        assert m.rank == choose_rank(torch.linalg.svdvals(d[f"{m.module}.weight"]), energy=0.9)
        assert m.energy >= 0.9 - 1e-6
        assert modules[m.module].lora_A["default"].weight.shape[0] == m.rank
    assert len({m.rank for m in result.modules}) > 1  # the rank pattern is exercised


def test_extras_left_out(fam: tuple[Path, Path], tmp_path: Path) -> None:
    """--extras skip: a plain LoRA; the changed embeddings, norms and biases stay the base's, and are reported."""
    base, model = fam
    result = extract_lora(model, base, tmp_path / "ad", energy=1.0, extras="skip")
    cfg = json.loads((tmp_path / "ad" / "adapter_config.json").read_text())
    assert cfg["modules_to_save"] is None and cfg["bias"] == "none"
    left = {e.tensor for e in result.extras}
    assert left and all(e.action == "left out" for e in result.extras)
    assert "model.embed_tokens.weight" in left and any("norm" in n for n in left)
    merged, plain, d = peft_merged(tmp_path / "ad", base), read_back_base(base), deltas(base, model)
    for name in plain:
        want = plain[name] if name in left else plain[name] + d[name]
        assert torch.allclose(merged[name], want, atol=2e-6), name


def test_unchanged_modules_are_skipped(tmp_path: Path) -> None:
    """Agents that changed only their MLPs: the adapter targets the MLP projections and nothing else."""
    base, agents = df.family(tmp_path / "fam", "llama", 1)
    result = extract_lora(agents[0], base, tmp_path / "ad", rank=1000)
    assert {m.module.rsplit(".", 1)[-1] for m in result.modules} == {"gate_proj", "up_proj", "down_proj"}
    assert all(m.rank == min(m.shape) for m in result.modules)  # a rank above the smaller dimension is capped
    assert result.extras == [] and any("self_attn" in n for n in result.zero)
    cfg = json.loads((tmp_path / "ad" / "adapter_config.json").read_text())
    assert all(".mlp." in t for t in cfg["target_modules"]) and cfg["r"] == 32


# --------------------------------------------------------------------------- command line


def test_cli_reports_and_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base, agents = df.family(tmp_path / "fam", "qwen2", 1, other=0.02)
    capsys.readouterr()
    argv = ["extract-lora", str(agents[0]), "--base", str(base), "-o", str(tmp_path / "ad"), "--rank", "4"]
    assert main([*argv, "--json", str(tmp_path / "r.json"), "--quiet"]) == 0
    record: dict[str, Any] = json.loads((tmp_path / "r.json").read_text())
    assert record["options"]["rank"] == 4 and len(record["modules"]) == 14
    assert json.loads((tmp_path / "ad" / "extraction.json").read_text())["modules"] == record["modules"]
    assert main([*argv[:-2], "--energy", "0.5", "-o", str(tmp_path / "ad2")]) == 0
    assert "LoRA modules at energy 0.5" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--energy", "0"], "--energy must lie in (0, 1]"),
        (["--rank", "0"], "--rank must be at least 1"),
        (["--rank", "4", "--dtype", "int8"], "use float32, bfloat16 or float16"),
        (["--rank", "4", "--same"], "no linear layer differs"),
    ],
)
def test_bad_input_gives_one_line_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], says: str
) -> None:
    base, agents = df.family(tmp_path / "fam", "llama", 1)
    model = str(base) if "--same" in extra else str(agents[0])
    capsys.readouterr()
    argv = [
        "extract-lora",
        model,
        "--base",
        str(base),
        "-o",
        str(tmp_path / "ad"),
        "--quiet",
        *[e for e in extra if e != "--same"],
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err
    assert not (tmp_path / "ad").exists() and [p for p in tmp_path.iterdir() if p.name.startswith(".")] == []
