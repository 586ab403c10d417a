"""Diagonal Fisher estimation (fisher.py), its CLI, and Fisher merging streamed through the driver."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from agentmerge import MergeConfig, ModelSpec, merge
from agentmerge.cli import main
from agentmerge.errors import MergeError
from agentmerge.evaluation.fisher import Sample, diagonal_fisher, load_causal_lm, write_fisher
from agentmerge.io.formats.checkpoint import Checkpoint
from agentmerge.io.formats.roles import FISHER_MARK

Family = tuple[Path, list[Path]]


def tensors_of(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    return out


@pytest.fixture(scope="module")
def fishers(tiny_family: Family, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Sampled Fisher of each tiny agent, made through the CLI."""
    root = tmp_path_factory.mktemp("fisher")
    outs = []
    for i, agent in enumerate(tiny_family[1]):
        out = root / f"f{i}"
        assert (
            main(["fisher", str(agent), "--samples", "3", "--max-tokens", "6", "--seed", str(i), "--out", str(out)])
            == 0
        )
        outs.append(out)
    return outs


def test_fisher_is_mean_squared_score(tiny_family: Family) -> None:
    """Against a naive score: per-token log-probabilities summed in a Python loop, one autograd call per sample."""
    model = load_causal_lm(tiny_family[1][0])
    samples = [Sample(torch.tensor([0, 5, 9, 2, 7]), 1), Sample(torch.tensor([0, 3, 3, 8]), 2)]
    got = diagonal_fisher(model, samples)
    params = dict(model.named_parameters())
    names = ["model.norm.weight", "model.embed_tokens.weight", "model.layers.1.mlp.down_proj.weight"]
    want = {n: torch.zeros_like(params[n]) for n in names}
    for s in samples:
        logits = model(input_ids=s.ids[None]).logits[0]
        total = torch.zeros(())
        for t in range(s.prompt, len(s.ids)):
            total = total + torch.log_softmax(logits[t - 1], dim=-1)[s.ids[t]]
        grads = torch.autograd.grad(total, [params[n] for n in names])
        for n, g in zip(names, grads, strict=True):
            want[n] += g**2 / len(samples)
    for n in names:
        torch.testing.assert_close(got[n], want[n], rtol=1e-4, atol=1e-12)
    assert got["model.embed_tokens.weight"].abs().sum() > 0


def test_fisher_files(tiny_family: Family, fishers: list[Path]) -> None:
    with Checkpoint(tiny_family[1][0]) as model, Checkpoint(fishers[0]) as f:
        floating = {n: i.shape for n, i in model.tensors.items() if i.dtype.is_floating_point}
        assert {n: i.shape for n, i in f.tensors.items()} == floating
        values = torch.cat([f.read(n).float() for n in f.tensors])
    assert bool(torch.isfinite(values).all()) and bool((values >= 0).all()) and float(values.max()) > 0
    assert (fishers[0] / "fisher.json").exists()
    with pytest.raises(Exception, match="already holds"):
        write_fisher({}, tiny_family[1][0], fishers[0])


def test_fisher_from_texts(tiny_family: Family, tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    model = tiny_family[1][1]
    words = {f"w{i}": i for i in range(90)}
    core = Tokenizer(models.WordLevel(vocab=words, unk_token="w2"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=core, unk_token="w2").save_pretrained(tmp_path / "tok")
    texts = tmp_path / "texts.txt"
    texts.write_text("w0 w5 w7 w9\n\nw0 w3 w3\nw0 w1 w4 w4 w8\n")
    out = tmp_path / "fisher"
    assert (
        main(
            [
                "fisher",
                str(model),
                "--texts",
                str(texts),
                "--samples",
                "2",
                "--dtype",
                "bfloat16",
                "--out",
                str(out),
                "--tokenizer",
                str(tmp_path / "tok"),
            ]
        )
        == 0
    )
    f = tensors_of(out)
    assert f["model.norm.weight"].dtype == torch.bfloat16 and float(f["model.norm.weight"].float().sum()) > 0
    lm = load_causal_lm(model)
    direct = diagonal_fisher(lm, [Sample(torch.tensor([0, 5, 7, 9])), Sample(torch.tensor([0, 3, 3]))])
    torch.testing.assert_close(f["model.norm.weight"].float(), direct["model.norm.weight"], rtol=1e-2, atol=0)


def fisher_config(family: Family, fishers: list[Path], **kw: object) -> MergeConfig:
    base, agents = family
    models = [
        ModelSpec(path=str(a), fisher=str(f), weight=w)
        for a, f, w in zip(agents, fishers, [1.0, 2.0, 1.0], strict=True)
    ]
    return MergeConfig(method="fisher", base=str(base), models=models, **kw)  # type: ignore[arg-type]


def test_fisher_merge_streams_deterministically(tiny_family: Family, fishers: list[Path], tmp_path: Path) -> None:
    outs = []
    for i, layout in enumerate([{"threads": 1}, {"threads": 2, "chunk_size": 100, "max_shard_size": "20KB"}]):
        merge(fisher_config(tiny_family, fishers, **layout), tmp_path / f"o{i}", quiet=True)
        outs.append(tensors_of(tmp_path / f"o{i}"))
    assert outs[0].keys() == outs[1].keys()
    assert all(outs[0][k].view(torch.uint8).equal(outs[1][k].view(torch.uint8)) for k in outs[0])
    # against the formula on whole tensors
    base = tensors_of(tiny_family[0])
    agents = [tensors_of(a) for a in tiny_family[1]]
    fs = [tensors_of(f) for f in fishers]
    name = "model.layers.0.self_attn.q_proj.weight"
    fw = [w * f[name].clamp(min=1e-10) for w, f in zip([1.0, 2.0, 1.0], fs, strict=True)]
    theta = sum(x * a[name].float() for x, a in zip(fw, agents, strict=True)) / sum(fw)
    torch.testing.assert_close(outs[0][name].float(), theta.to(torch.bfloat16).float(), rtol=1e-2, atol=1e-4)
    assert not torch.equal(outs[0][name], base[name])


def test_equal_or_zero_fisher_is_linear(tiny_family: Family, fishers: list[Path], tmp_path: Path) -> None:
    base, agents = tiny_family
    ref = tensors_of(fishers[0])
    for label, value in (("equal", 0.25), ("zero", 0.0)):
        folder = tmp_path / label
        folder.mkdir()
        fisher = {k: torch.full_like(v, value) for k, v in ref.items()}
        save_file(fisher, str(folder / "model.safetensors"), metadata=dict([FISHER_MARK]))
        cfg = fisher_config(tiny_family, [folder] * 3)
        merge(cfg, tmp_path / f"m_{label}", quiet=True)
        lin = MergeConfig(
            method="linear",
            base=str(base),
            models=[ModelSpec(path=str(a), weight=w) for a, w in zip(agents, [1.0, 2.0, 1.0], strict=True)],
        )
        merge(lin, tmp_path / f"l_{label}", quiet=True)
        got, want = tensors_of(tmp_path / f"m_{label}"), tensors_of(tmp_path / f"l_{label}")
        for k in want:
            torch.testing.assert_close(got[k].float(), want[k].float(), rtol=8e-3, atol=1e-6)


def test_fisher_missing_tensor(tiny_family: Family, fishers: list[Path], tmp_path: Path) -> None:
    ref = tensors_of(fishers[0])
    ref.pop("model.norm.weight")
    save_file(ref, str(tmp_path / "partial.safetensors"), metadata=dict([FISHER_MARK]))
    with pytest.raises(MergeError, match=r"model\.norm\.weight"):
        merge(fisher_config(tiny_family, [tmp_path / "partial.safetensors"] * 3), tmp_path / "out", quiet=True)


def test_fisher_from_flags_and_yaml(tiny_family: Family, fishers: list[Path], tmp_path: Path) -> None:
    base, agents = tiny_family
    flags = ["merge", "--method", "fisher", "--base", str(base), "--quiet", "--weights", "1,2,1"]
    flags += [x for a in agents for x in ("--model", str(a))] + [x for f in fishers for x in ("--fisher", str(f))]
    assert main([*flags, "-o", str(tmp_path / "flags")]) == 0
    doc = {
        "method": "fisher",
        "base": str(base),
        "models": [
            {"path": str(a), "fisher": str(f), "weight": w} for a, f, w in zip(agents, fishers, [1, 2, 1], strict=True)
        ],
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(doc))
    assert main(["merge", str(tmp_path / "c.yaml"), str(tmp_path / "yaml"), "--quiet"]) == 0
    a, b = tensors_of(tmp_path / "flags"), tensors_of(tmp_path / "yaml")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert main([*flags[:-4], "--fisher", str(fishers[0]), "-o", str(tmp_path / "bad")]) == 2
