"""The driver: streamed merges equal in-memory merges bit for bit, RAM+ rho by hand, real model round trips."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from agentmerge import MergeConfig, ModelSpec, Override, merge
from agentmerge.errors import CheckpointError
from agentmerge.io.formats.checkpoint import Checkpoint
from agentmerge.methods.deltas import overlap_histogram, update_mask
from agentmerge.methods.fused.jit import available
from agentmerge.methods.ram import compiled as ram_compiled
from agentmerge.methods.registry import METHODS
from agentmerge.methods.spec import Chunk, TensorStats, update_threshold


def load_folder(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def in_memory_merge(cfg: MergeConfig) -> dict[str, torch.Tensor]:
    """Whole tensors in memory, one kernel call per tensor: the reference the streamed engine must equal."""
    base = load_folder(Path(cfg.base or cfg.models[0].path))
    models = [load_folder(Path(m.path)) for m in cfg.models]
    eps = {n: update_threshold(cfg.tensor_params(n)) for n in base}  # each tensor's own threshold
    taus = {n: torch.stack([m[n].float() for m in models]) - base[n].float() for n in base}
    hists = {n: overlap_histogram(update_mask(t.reshape(len(models), -1), eps[n])) for n, t in taus.items()}
    model_hist = torch.stack(list(hists.values())).sum(0)
    out = {}
    for name, b in base.items():
        tau = taus[name].reshape(len(models), -1)
        stats = TensorStats(hists[name], model_hist)
        weights = torch.tensor([m.weight for m in cfg.models])
        c = Chunk(
            name=name, start=0, stop=b.numel(), base=b.float().reshape(-1), tau=tau, weights=weights,
            params=cfg.tensor_params(name), stats=stats, seed=cfg.seed,
        )  # fmt: skip
        out[name] = (b.float().reshape(-1) + METHODS[cfg.method].kernel(c)).to(b.dtype).reshape(b.shape)
    return out


def family_config(family: tuple[Path, list[Path]], method: str, **kw: object) -> MergeConfig:
    base, agents = family
    return MergeConfig(method=method, base=str(base), models=[ModelSpec(path=str(a)) for a in agents], **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("method", ["ram", "ram_plus", "linear", "task_arithmetic", "unique_only"])
def test_streamed_equals_in_memory(tiny_family: tuple[Path, list[Path]], tmp_path: Path, method: str) -> None:
    reference = in_memory_merge(family_config(tiny_family, method))
    layouts = [(1 << 22, "5GB", 1), (7, "3KB", 2), (100, "20KB", 2), (2048, "1KB", 1)]
    for i, (chunk, shard, threads) in enumerate(layouts):
        cfg = family_config(tiny_family, method, chunk_size=chunk, max_shard_size=shard, threads=threads)
        merge(cfg, tmp_path / f"out{i}", quiet=True)
        got = load_folder(tmp_path / f"out{i}")
        assert got.keys() == reference.keys()
        for name, t in reference.items():
            assert got[name].dtype == t.dtype
            assert torch.equal(got[name], t), f"{method}: {name} differs with chunk {chunk}, shard {shard}"


def test_output_bytes_identical_across_runs(tiny_family: tuple[Path, list[Path]], tmp_path: Path) -> None:
    for i, threads in enumerate((1, 2)):
        merge(family_config(tiny_family, "ram_plus", chunk_size=64, threads=threads), tmp_path / f"o{i}", quiet=True)
    a, b = (tmp_path / "o0" / "model.safetensors").read_bytes(), (tmp_path / "o1" / "model.safetensors").read_bytes()
    assert a == b


@pytest.mark.parametrize("scope", ["global", "tensor"])
@pytest.mark.parametrize("fast", ["1", "0"])
def test_epsilon_override_reaches_statistics_and_mask(
    tiny_family: tuple[Path, list[Path]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scope: str, fast: str
) -> None:
    """A per-tensor epsilon counts RAM+'s rho at the threshold it masks with, and keeps the compiled kernels on.

    (Once, an override ``*mlp*: {epsilon: 1e-3}`` took lambda from counts at 1e-5 while masking at 1e-3, and
    silently sent those tensors to the reference kernels.)
    """
    monkeypatch.setenv("AGENTMERGE_FUSED", fast)
    calls: list[int] = []
    ram_loop = ram_compiled.ram_loop
    monkeypatch.setattr(ram_compiled, "ram_loop", lambda *a: calls.append(a[1].shape[1]) or ram_loop(*a))
    overrides = [Override(pattern="*mlp*", params={"epsilon": 1e-3})]
    params = {"scope": scope, "r": 0.5}
    cfg = family_config(tiny_family, "ram_plus", params=params, overrides=overrides, chunk_size=100)
    reference = in_memory_merge(cfg)
    merge(cfg, tmp_path / "out", quiet=True)
    got = load_folder(tmp_path / "out")
    for name, t in reference.items():
        assert torch.equal(got[name], t), name
    if fast == "1" and available():
        with Checkpoint(str(tiny_family[0])) as base:
            chunks = sum(-(-info.numel // 100) for info in base.tensors.values())
        assert len(calls) == chunks  # every chunk, the overridden ones too, took the compiled kernel


def write_model(folder: Path, tensors: dict[str, torch.Tensor]) -> Path:
    folder.mkdir(parents=True)
    save_file(tensors, folder / "model.safetensors")
    return folder


def test_global_and_tensor_rho_by_hand(tmp_path: Path) -> None:
    """Two tensors, two agents. Counted by hand:

    tensor a (4 elements): agent0 updates 0,1,2; agent1 updates 2,3 -> a0: unique 2 shared 1; a1: unique 1 shared 1
    tensor b (4 elements): agent0 updates 0;     agent1 updates 0,1,2,3 -> a0: unique 0 shared 1; a1: unique 3 shared 1
    global: a0 rho = 2/2 = 1; a1 rho = 2/4 = 0.5.  tensor-local: a: a0 1/2, a1 1/1; b: a0 inf, a1 1/3.
    """
    z = torch.zeros(4)
    base = write_model(tmp_path / "base", {"a": z, "b": z.clone()})
    a0 = write_model(tmp_path / "a0", {"a": torch.tensor([1.0, 1.0, 1.0, 0.0]), "b": torch.tensor([1.0, 0, 0, 0])})
    a1 = write_model(tmp_path / "a1", {"a": torch.tensor([0.0, 0.0, 3.0, 2.0]), "b": torch.tensor([3.0, 2, 2, 2])})
    r = 0.5
    models = [ModelSpec(path=str(a0)), ModelSpec(path=str(a1))]
    for scope, lam in {
        "global": {"a0": 1 + r * 1.0, "a1": 1 + r * 0.5},
        "tensor": {"a_a0": 1 + r * 0.5, "a_a1": 1 + r * 1.0, "b_a1": 1 + r / 3},
    }.items():
        cfg = MergeConfig(method="ram_plus", base=str(base), models=models, params={"r": r, "scope": scope})
        merge(cfg, tmp_path / scope, quiet=True)
        out = load_folder(tmp_path / scope)
        la0, la1 = (lam["a0"], lam["a1"]) if scope == "global" else (lam["a_a0"], lam["a_a1"])
        lb1 = lam["a1"] if scope == "global" else lam["b_a1"]
        assert out["a"].tolist() == pytest.approx([la0, la0, 2.0, 2.0 * la1])
        assert out["b"].tolist() == pytest.approx([2.0, 2.0 * lb1, 2.0 * lb1, 2.0 * lb1])


def test_authors_form_matches_released_formula(tmp_path: Path) -> None:
    z = torch.zeros(4)
    base = write_model(tmp_path / "base", {"a": z})
    a0 = write_model(tmp_path / "a0", {"a": torch.tensor([1.0, 1.0, 1.0, 0.0])})  # unique 2, shared 1: rho 0.5
    a1 = write_model(tmp_path / "a1", {"a": torch.tensor([0.0, 0.0, 3.0, 2.0])})  # unique 1, shared 1: rho 1
    models = [ModelSpec(path=str(a0)), ModelSpec(path=str(a1))]
    params = {"form": "authors", "rescale_factor": 1.2}
    merge(MergeConfig(method="ram_plus", base=str(base), models=models, params=params), tmp_path / "o", quiet=True)
    assert load_folder(tmp_path / "o")["a"].tolist() == pytest.approx([1.1, 1.1, 2.0, 2.0 * 1.2])


def test_non_float_and_excluded_tensors_copied(tmp_path: Path) -> None:
    base = write_model(tmp_path / "base", {"w": torch.zeros(3), "norm.weight": torch.ones(3), "ids": torch.arange(3)})
    agent = write_model(
        tmp_path / "a", {"w": torch.ones(3), "norm.weight": torch.full((3,), 2.0), "ids": torch.arange(3) + 5}
    )
    cfg = MergeConfig(method="ram", base=str(base), models=[ModelSpec(path=str(agent))], exclude=["*norm*"])
    merge(cfg, tmp_path / "o", quiet=True)
    out = load_folder(tmp_path / "o")
    assert out["w"].tolist() == [1.0, 1.0, 1.0]
    assert out["norm.weight"].tolist() == [1.0, 1.0, 1.0]
    assert out["ids"].tolist() == [0, 1, 2]


def test_output_dtype_and_config(tiny_family: tuple[Path, list[Path]], tmp_path: Path) -> None:
    merge(family_config(tiny_family, "ram", dtype="float32"), tmp_path / "o", quiet=True)
    out = load_folder(tmp_path / "o")
    assert {t.dtype for t in out.values()} == {torch.float32}
    assert json.loads((tmp_path / "o" / "config.json").read_text())["torch_dtype"] == "float32"
    merge(family_config(tiny_family, "ram"), tmp_path / "b", quiet=True)
    assert {t.dtype for t in load_folder(tmp_path / "b").values()} == {torch.bfloat16}
    assert json.loads((tmp_path / "b" / "config.json").read_text())["torch_dtype"] == "bfloat16"


def test_existing_output_refused_unless_force(tiny_family: tuple[Path, list[Path]], tmp_path: Path) -> None:
    out = tmp_path / "o"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(CheckpointError, match="--force"):
        merge(family_config(tiny_family, "ram"), out, quiet=True)
    assert (out / "keep.txt").read_text() == "mine"
    with pytest.raises(CheckpointError, match="--force-any"):  # --force replaces only an earlier merge output
        merge(family_config(tiny_family, "ram"), out, force=True, quiet=True)
    assert (out / "keep.txt").read_text() == "mine"
    merge(family_config(tiny_family, "ram"), out, force_any=True, quiet=True)
    assert not (out / "keep.txt").exists() and (out / "model.safetensors").exists()
    merge(family_config(tiny_family, "linear"), out, force=True, quiet=True)  # an earlier output: --force is enough
    assert json.loads((out / "merge.json").read_text())["config"]["method"] == "linear"
    assert [p.name for p in tmp_path.iterdir()] == ["o"]  # no temporary, old or lock files left


def test_card_and_record(tiny_family: tuple[Path, list[Path]], tmp_path: Path) -> None:
    result = merge(family_config(tiny_family, "ram_plus"), tmp_path / "o", quiet=True)
    card = (tmp_path / "o" / "README.md").read_text()
    assert card.startswith("---\nlibrary_name:") and "ram_plus" in card and "| agent0 |" in card  # local: no base_model
    record = json.loads((tmp_path / "o" / "merge.json").read_text())
    assert record["config"]["method"] == "ram_plus"
    assert [a["name"] for a in record["probe"]] == ["agent0", "agent1", "agent2"]
    assert result.model_hist is not None and len(result.model_hist) == 3


RECORD_KEYS = [  # merge.json of a merge with the default mask rule, as it was before adaptive thresholds
    "agentmerge", "torch", "python", "created", "config", "resolved_params", "inputs", "hashing", "hub", "probe",
    "scales", "vocab", "sources", "seconds",
]  # fmt: skip


@pytest.mark.parametrize("params", [{}, {"mask_dtype": "base"}])
def test_merge_json_without_adaptive_rule_is_unchanged(
    tiny_family: tuple[Path, list[Path]], tmp_path: Path, params: dict[str, object]
) -> None:
    result = merge(family_config(tiny_family, "ram", params=params), tmp_path / "o", quiet=True)
    text = (tmp_path / "o" / "merge.json").read_text()
    record = json.loads(text)
    assert list(record) == RECORD_KEYS
    assert text == json.dumps(record, indent=2) + "\n"  # written as it always was
    assert result.thresholds is None and "thresholds" not in result.to_dict()


def test_merge_json_of_an_adaptive_rule(tiny_family: tuple[Path, list[Path]], tmp_path: Path) -> None:
    params = {"epsilon_rule": "valley"}
    result = merge(family_config(tiny_family, "ram", params=params), tmp_path / "o", quiet=True)
    text = (tmp_path / "o" / "merge.json").read_text()
    record = json.loads(text)
    assert list(record) == [*RECORD_KEYS[:-1], "thresholds", "seconds"]
    thresholds = record["thresholds"]
    assert thresholds == result.thresholds
    merged = result.merged_tensors
    assert len(thresholds["tensors"]) == merged and all(len(v) == 3 for v in thresholds["tensors"].values())
    assert len(text.splitlines()) < len(json.dumps(record, indent=2).splitlines()) - 2 * merged  # one line each
    fallbacks = [sum(i in v for v in thresholds["fallback"].values()) for i in range(3)]
    assert [row["fallbacks"] for row in thresholds["summary"]] == fallbacks
    for name, agents in thresholds["fallback"].items():
        assert all(thresholds["tensors"][name][i] == 1e-05 for i in agents)  # no valley: epsilon


def test_ram_merge_generates_in_transformers(tiny_family: tuple[Path, list[Path]], tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from agentmerge.cli import main

    base, agents = tiny_family
    argv = ["merge", "--method", "ram_plus", "--base", str(base), "-o", str(tmp_path / "o"), "--quiet"]
    assert main(argv + [x for a in agents for x in ("--model", str(a))]) == 0
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "o")
    assert model.dtype == torch.bfloat16
    out = model.generate(torch.tensor([[2, 3, 4]]), max_new_tokens=4, do_sample=False)
    assert out.shape == (1, 7)
    merged = load_folder(tmp_path / "o")
    for name, p in model.state_dict().items():
        if name in merged:
            assert torch.equal(p, merged[name]), name


def test_llama_tied_weights_stay_tied(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=48,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    base = LlamaForCausalLM(config).to(torch.bfloat16)
    base.save_pretrained(tmp_path / "base")
    for i in range(2):
        agent = LlamaForCausalLM(config).to(torch.bfloat16)
        agent.load_state_dict(base.state_dict())
        with torch.no_grad():
            agent.model.embed_tokens.weight[i] += 0.5
        agent.save_pretrained(tmp_path / f"a{i}")
    stored = load_folder(tmp_path / "base").keys()
    cfg = MergeConfig(
        method="ram", base=str(tmp_path / "base"), models=[ModelSpec(path=str(tmp_path / f"a{i}")) for i in range(2)]
    )
    merge(cfg, tmp_path / "o", quiet=True)
    assert load_folder(tmp_path / "o").keys() == stored
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "o")
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    want = base.model.embed_tokens.weight[0].float() + 0.5
    assert torch.allclose(model.model.embed_tokens.weight[0].float(), want.bfloat16().float())


def test_tokenizer_files_from_base_or_named_source(tiny_family: tuple[Path, list[Path]], tmp_path: Path) -> None:
    import shutil

    base, agents = tiny_family
    own_base = tmp_path / "base"
    shutil.copytree(base, own_base)
    (own_base / "tokenizer.json").write_text('{"from": "base"}')
    (own_base / "tokenizer_config.json").write_text("{}")
    source = tmp_path / "tok"
    source.mkdir()
    (source / "tokenizer.json").write_text('{"from": "source"}')
    models = [ModelSpec(path=str(a)) for a in agents]
    merge(MergeConfig(method="ram", base=str(own_base), models=models), tmp_path / "o1", quiet=True)
    assert (tmp_path / "o1" / "tokenizer.json").read_text() == '{"from": "base"}'
    assert (tmp_path / "o1" / "tokenizer_config.json").exists()
    cfg = MergeConfig(method="ram", base=str(own_base), models=models, tokenizer_source=str(source))
    merge(cfg, tmp_path / "o2", quiet=True)
    assert (tmp_path / "o2" / "tokenizer.json").read_text() == '{"from": "source"}'
    assert (tmp_path / "o2" / "config.json").read_text() == (own_base / "config.json").read_text()
