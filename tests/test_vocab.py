"""Resized vocabularies: common rows merged like any tensor, added rows from the adding agent, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from agentmerge import MergeConfig, ModelSpec, merge
from agentmerge.errors import MergeError
from agentmerge.io.formats.roles import FISHER_MARK
from agentmerge.io.formats.vocab import ResizedTensor, new_rows
from agentmerge.methods.registry import METHODS
from vocabmodels import VOCAB_TENSORS, agent, base_model, tensors, truncated

ADDED = ("<tool>", "</tool>")


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """base; ``tool`` adds two tokens; ``tool2`` adds the same two; ``other`` adds two others; ``math`` adds none."""
    root = tmp_path_factory.mktemp("vocab")
    base = base_model(root / "base")
    out = {"base": base}
    out["tool"] = agent(base, root / "tool", seed=1, added=ADDED)
    out["tool2"] = agent(base, root / "tool2", seed=2, added=ADDED, dtype=torch.float32)
    out["other"] = agent(base, root / "other", seed=3, added=("<a>", "<b>"))
    out["math"] = agent(base, root / "math", seed=4)
    rows = json.loads((base / "config.json").read_text())["vocab_size"]
    out["tool_cut"] = truncated(out["tool"], root / "tool_cut", rows)
    out["tool2_cut"] = truncated(out["tool2"], root / "tool2_cut", rows)
    return out


def base_rows(family: dict[str, Path]) -> int:
    return int(json.loads((family["base"] / "config.json").read_text())["vocab_size"])


def config(family: dict[str, Path], method: str, names: list[str], **kw: object) -> MergeConfig:
    models = [ModelSpec(path=str(family[n]), name=n) for n in names]
    return MergeConfig(method=method, base=str(family["base"]), models=models, chunk_size=64, **kw)  # type: ignore[arg-type]


def fisher_file(model_dir: Path, folder: Path, seed: int) -> Path:
    """A marked Fisher file with positive values in the model's own shapes."""
    folder.mkdir()
    gen = torch.Generator().manual_seed(seed)
    values = {n: torch.rand(t.shape, generator=gen) + 0.1 for n, t in tensors(model_dir).items()}
    save_file(values, folder / "model.safetensors", metadata=dict([FISHER_MARK]))
    return folder


def fisher_config(
    family: dict[str, Path], names: list[str], folder: Path, method: str = "fisher", **kw: object
) -> MergeConfig:
    """Fisher merges of ``names`` (``method``: one that reads Fisher files); a ``_cut`` agent's Fisher is its full
    agent's, cut to the base's rows."""
    folder.mkdir()
    models = []
    for i, n in enumerate(names):
        full = fisher_file(family[n.removesuffix("_cut")], folder / n, seed=i)
        if n.endswith("_cut"):  # the truncated agent's Fisher: the full one's first rows
            cut = {k: (v[: base_rows(family)] if k in VOCAB_TENSORS else v) for k, v in tensors(full).items()}
            save_file(cut, full / "model.safetensors", metadata=dict([FISHER_MARK]))
        models.append(ModelSpec(path=str(family[n]), name=n, fisher=str(full)))
    return MergeConfig(method=method, base=str(family["base"]), models=models, chunk_size=64, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("method", sorted(METHODS))
def test_common_rows_equal_truncated_merge_and_added_rows_copied(
    family: dict[str, Path], tmp_path: Path, method: str
) -> None:
    """Every method: rows [0, V_base) equal the merge of the agents cut to V_base rows; the rest are tool's."""
    if "fisher" in METHODS[method].model_inputs:  # fisher, ram_fisher (with r > 0: its Fisher-mass pass too)
        kw: dict[str, object] = {"params": {"r": 0.1}} if METHODS[method].param("r") is not None else {}
        full = fisher_config(family, ["tool", "math"], tmp_path / "f1", method, **kw)
        cut = fisher_config(family, ["tool_cut", "math"], tmp_path / "f2", method, **kw)
    else:
        full, cut = config(family, method, ["tool", "math"]), config(family, method, ["tool_cut", "math"])
    merge(full, tmp_path / "full", quiet=True)
    merge(cut, tmp_path / "cut", quiet=True)
    got, want, tool = tensors(tmp_path / "full"), tensors(tmp_path / "cut"), tensors(family["tool"])
    v = base_rows(family)
    assert got.keys() == want.keys()
    for name, w in want.items():
        if name in VOCAB_TENSORS:
            assert got[name].shape == (v + len(ADDED), w.shape[1])
            assert torch.equal(got[name][:v], w), name
            assert torch.equal(got[name][v:], tool[name][v:]), name
        else:
            assert torch.equal(got[name], w), name
        assert got[name].dtype == torch.bfloat16  # the base's dtype
    cfg = json.loads((tmp_path / "full" / "config.json").read_text())
    assert cfg["vocab_size"] == v + len(ADDED)


def test_task_arithmetic_by_hand(family: dict[str, Path], tmp_path: Path) -> None:
    """A naive per-element reference: theta_0 + lambda * sum_i tau_i on common rows, tool's values on added rows."""
    merge(config(family, "task_arithmetic", ["tool", "math"], params={"lambda": 0.5}), tmp_path / "o", quiet=True)
    got, base = tensors(tmp_path / "o"), tensors(family["base"])
    tool, math_ = tensors(family["tool"]), tensors(family["math"])
    v = base_rows(family)
    name = "model.embed_tokens.weight"
    b, t, m = base[name].float(), tool[name].float(), math_[name].float()
    want = torch.empty(got[name].shape)
    for r in range(want.shape[0]):
        for c in range(want.shape[1]):
            if r < v:
                want[r, c] = b[r, c] + 0.5 * ((t[r, c] - b[r, c]) + (m[r, c] - b[r, c]))
            else:
                want[r, c] = t[r, c]
    assert torch.equal(got[name], want.to(torch.bfloat16))


def test_two_agents_with_identical_tokens_average_their_rows(family: dict[str, Path], tmp_path: Path) -> None:
    merge(config(family, "ties", ["tool", "tool2", "math"]), tmp_path / "o", quiet=True)
    merge(config(family, "ties", ["tool_cut", "tool2_cut", "math"]), tmp_path / "ref", quiet=True)
    got, ref = tensors(tmp_path / "o"), tensors(tmp_path / "ref")
    a, b = tensors(family["tool"]), tensors(family["tool2"])
    v = base_rows(family)
    for name in VOCAB_TENSORS:
        assert torch.equal(got[name][:v], ref[name])
        mean = (a[name][v:].float() + b[name][v:].float()) / 2
        assert torch.equal(got[name][v:], mean.to(torch.bfloat16))
    record = json.loads((tmp_path / "o" / "merge.json").read_text())
    assert record["vocab"]["added_by"] == ["tool", "tool2"]
    assert record["vocab"]["added_tokens"] == {str(v): "<tool>", str(v + 1): "</tool>"}


def test_new_rows_weighted_mean() -> None:
    values = torch.tensor([[1.0, 2.0], [3.0, 6.0]])
    assert torch.equal(new_rows(values[:1], torch.tensor([5.0])), values[0])
    assert torch.equal(new_rows(values, torch.tensor([1.0, 3.0])), torch.tensor([2.5, 5.0]))
    assert torch.equal(new_rows(values, torch.tensor([1.0, -1.0])), torch.tensor([2.0, 4.0]))  # no positive sum


def test_added_row_chunks_are_whole_rows() -> None:
    t = ResizedTensor("e", base_rows=10, out_rows=13, row_shape=(16,), adders=(0,))
    assert t.extra_chunks(40) == ((160, 192), (192, 208))  # 2 rows, then the last one
    assert t.extra_chunks(1) == ((160, 176), (176, 192), (192, 208))


def test_different_added_tokens_refused(family: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(MergeError) as e:
        merge(config(family, "ties", ["tool", "other"]), tmp_path / "o", quiet=True)
    msg = str(e.value)
    assert "tool" in msg and "other" in msg and "model.embed_tokens.weight" in msg
    v = base_rows(family)
    assert f"rows {v}..{v + 1}" in msg and "'<tool>' vs '<a>'" in msg
    assert not (tmp_path / "o").exists()


def test_base_larger_than_agent_refused(family: dict[str, Path], tmp_path: Path) -> None:
    models = [ModelSpec(path=str(family["math"]))]
    cfg = MergeConfig(method="task_arithmetic", base=str(family["tool"]), models=models)
    with pytest.raises(MergeError, match=r"rows \d+\.\.\d+ removed, or a base larger than this agent"):
        merge(cfg, tmp_path / "o", quiet=True)


def test_only_one_vocab_tensor_resized_refused(family: dict[str, Path], tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    t = tensors(family["tool"])
    t["lm_head.weight"] = t["lm_head.weight"][: base_rows(family)].clone()
    save_file(t, bad / "model.safetensors", metadata={"format": "pt"})
    (bad / "config.json").write_text((family["tool"] / "config.json").read_text())
    with pytest.raises(MergeError, match="different numbers of rows"):
        merge(
            config(family, "ties", ["math"]).model_copy(update={"models": [ModelSpec(path=str(bad))]}), tmp_path / "o"
        )


def test_other_shape_change_still_refused(family: dict[str, Path], tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    t = tensors(family["math"])
    t["model.layers.0.mlp.up_proj.weight"] = torch.zeros(40, 16, dtype=torch.bfloat16)
    save_file(t, bad / "model.safetensors", metadata={"format": "pt"})
    (bad / "config.json").write_text((family["math"] / "config.json").read_text())
    with pytest.raises(MergeError, match=r"up_proj\.weight' has shape"):
        merge(
            config(family, "ties", ["math"]).model_copy(update={"models": [ModelSpec(path=str(bad))]}), tmp_path / "o"
        )


def test_output_loads_and_generates_with_the_added_tokens(family: dict[str, Path], tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    merge(config(family, "ram_plus", ["math", "tool"]), tmp_path / "o", quiet=True)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "o")
    tok = AutoTokenizer.from_pretrained(tmp_path / "o")
    v = base_rows(family)
    assert len(tok) == v + 2 and model.config.vocab_size == v + 2
    ids = tok("a<tool>b", return_tensors="pt")["input_ids"]
    assert v in ids[0].tolist()
    out = model.generate(ids, max_new_tokens=3, do_sample=False)
    assert out.shape == (1, ids.shape[1] + 3)
    assert torch.equal(model.lm_head.weight[v:], tensors(family["tool"])["lm_head.weight"][v:])
    card = (tmp_path / "o" / "README.md").read_text()
    assert f"vocabulary: rows {v}..{v + 1} of lm_head.weight, model.embed_tokens.weight added by tool" in card


def test_dry_run_names_the_added_rows(family: dict[str, Path], tmp_path: Path) -> None:
    from agentmerge.engine.merge_dryrun import plan_merge

    plan = plan_merge(config(family, "ties", ["tool", "math"]), tmp_path / "o", probe=False)
    v = base_rows(family)
    assert f"vocabulary: rows {v}..{v + 1}" in plan.text() and "tokenizer and chat template from tool" in plan.text()
    out_bytes = sum(t.numel() * 2 for t in tensors(family["tool"]).values())
    assert plan.bytes_written >= out_bytes and not (tmp_path / "o").exists()


def test_probe_covers_common_rows_and_reports_added_rows(family: dict[str, Path]) -> None:
    from agentmerge.engine.probe import probe

    full = probe(str(family["base"]), [str(family["tool"]), str(family["math"])], quiet=True)
    cut = probe(str(family["base"]), [str(family["tool_cut"]), str(family["math"])], quiet=True)
    assert [a.updated for a in full.agents] == [a.updated for a in cut.agents]
    assert full.added_rows == {"tool": {n: 2 for n in VOCAB_TENSORS}}
    assert cut.added_rows == {}
