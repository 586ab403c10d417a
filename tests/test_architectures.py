"""The architectures users merge now: every input tensor reaches the output, the output loads and generates.

Per architecture (``archmodels``: Qwen3, Qwen3-MoE, Gemma 3, Qwen2-VL, LLaVA, Bamba, LFM2, Qwen3-Next), a base and two agents
with sparse updates on every floating tensor, on disjoint elements:

- RAM gives exactly ``base + tau_1 + tau_2`` on every tensor (a naive reference), the output holds every input
  tensor, loads in transformers with no missing or unexpected key, and its logits and greedy tokens (for the
  VLMs also the logits of a prompt with an image) are those of the reference weights loaded into the same class;
- TIES and TSV-M outputs hold every tensor, load and generate, and move every tensor the agents moved (of 64
  elements or more: TIES's trim may drop the one update a tiny tensor has), and none they did not;
- a planner that would drop a tensor (simulated) fails the merge, naming the tensor, and writes nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import archmodels as am
from agentmerge import MergeConfig, ModelSpec, merge
from agentmerge.engine import merge as merge_module
from agentmerge.engine.coverage import check_written
from agentmerge.errors import MergeError
from agentmerge.io.output.shards import PlannedTensor

transformers = pytest.importorskip("transformers")
PROMPT = torch.tensor([[10, 11, 12, 13, 14, 15]])


@pytest.fixture(scope="module", params=list(am.CONFIGS))
def fam(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, list[Path], Any]:
    arch = str(request.param)
    return (arch, *am.family(arch, tmp_path_factory.mktemp(arch)))


def run(method: str, base: Path, agents: list[Path], out: Path, **kw: Any) -> Path:
    cfg = MergeConfig(method=method, base=str(base), models=[ModelSpec(path=str(a)) for a in agents], **kw)
    merge(cfg, out, quiet=True)
    return out


def load(arch: str, folder: Path) -> Any:
    model, info = am.model_class(arch).from_pretrained(folder, output_loading_info=True)
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    assert not bad, bad
    return model.eval()


def generate(model: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logits of the prompt, 6 greedy tokens)``."""
    with torch.no_grad():
        logits = model(input_ids=PROMPT).logits
        tokens = model.generate(input_ids=PROMPT, max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0)
    assert tokens.shape == (1, PROMPT.shape[1] + 6)
    return logits, tokens


def test_ram_is_the_sum_of_the_updates_and_loads(fam: tuple[str, Path, list[Path], Any], tmp_path: Path) -> None:
    arch, base, agents, taus = fam
    out = run("ram", base, agents, tmp_path / "ram")
    got, want = am.tensors(out), am.tensors(base)
    assert got.keys() == want.keys() == am.tensors(agents[0]).keys()  # every input tensor is in the output
    for name, t in want.items():
        ref = t + sum(tau[name] for tau in taus) if t.dtype.is_floating_point else t
        torch.testing.assert_close(got[name], ref, rtol=0, atol=1e-6, msg=name)
    for prefix in am.VISION.get(arch, ()):  # the vision tower and projector are merged, not dropped
        assert any(n.startswith(prefix) and not torch.equal(got[n], want[n]) for n in got), prefix
    reference = am.write_like(base, tmp_path / "reference", {k: v.contiguous() for k, v in got.items()})
    logits, tokens = generate(load(arch, out))
    want_logits, want_tokens = generate(load(arch, reference))
    torch.testing.assert_close(logits, want_logits)
    assert torch.equal(tokens, want_tokens)
    assert not torch.allclose(logits, generate(load(arch, base))[0])  # the merge changed the model
    if arch in am.VISION:  # an image through the merged tower and projector: the reference's logits
        with torch.no_grad():
            seen = load(arch, out)(**am.image_inputs(arch)).logits
            torch.testing.assert_close(seen, load(arch, reference)(**am.image_inputs(arch)).logits)
            assert not torch.allclose(seen, load(arch, base)(**am.image_inputs(arch)).logits)


@pytest.mark.parametrize("method", ["ties", "tsv"])
def test_ties_and_tsv_keep_every_tensor(fam: tuple[str, Path, list[Path], Any], method: str, tmp_path: Path) -> None:
    arch, base, agents, taus = fam
    out = run(method, base, agents, tmp_path / method)
    got, want = am.tensors(out), am.tensors(base)
    assert got.keys() == want.keys()
    for name, t in want.items():
        moved = any(bool(tau[name].any()) for tau in taus if name in tau)
        changed = not torch.equal(got[name], t)
        assert changed <= moved, name  # nothing the agents left alone changes
        assert changed or not moved or t.numel() < 64, name  # TIES may trim all of a tiny tensor's few updates
    generate(load(arch, out))


def test_excluded_vision_tower_is_the_bases(tmp_path: Path) -> None:
    """``exclude`` copies the base's tower and projector unchanged (copied, never dropped); the text merges."""
    base, agents, _ = am.family("qwen2_vl", tmp_path / "fam")
    out = run("ram", base, agents, tmp_path / "out", exclude=["visual.*"])
    got, want = am.tensors(out), am.tensors(base)
    assert got.keys() == want.keys()
    vision = [n for n in want if n.startswith("visual.")]
    assert vision and all(torch.equal(got[n], want[n]) for n in vision)
    assert not torch.equal(got["model.embed_tokens.weight"], want["model.embed_tokens.weight"])
    generate(load("qwen2_vl", out))


def test_newer_vlm_layout_merges_and_loads(tmp_path: Path) -> None:
    """Checkpoints saved under the in-memory names (``model.language_model.*``, ``model.visual.*``) merge to the
    same weights under those names, and transformers loads them as it loads the legacy layout."""
    base, agents, _ = am.family("qwen2_vl", tmp_path / "fam")
    legacy = run("ram", base, agents, tmp_path / "legacy")

    def rename(name: str) -> str:
        if name.startswith("visual."):
            return "model." + name
        return name.replace("model.", "model.language_model.", 1) if name.startswith("model.") else name

    new = [
        am.write_like(base, tmp_path / f"new{i}", {rename(k): v for k, v in am.tensors(p).items()})
        for i, p in enumerate([base, *agents])
    ]
    out = run("ram", new[0], new[1:], tmp_path / "new")
    got = am.tensors(out)
    assert got.keys() == {rename(k) for k in am.tensors(legacy)}
    assert all(torch.equal(got[rename(k)], v) for k, v in am.tensors(legacy).items())
    assert torch.equal(generate(load("qwen2_vl", out))[1], generate(load("qwen2_vl", legacy))[1])


def test_a_dropped_tensor_fails_the_merge(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A planner that knows only the text layers (as name-table tools do) would drop the vision tower: the
    merge stops naming the first lost tensor, and nothing is written."""
    base, agents, _ = am.family("llava", tmp_path / "fam")
    real = merge_module.make_plan

    def text_only(*args: Any, **kw: Any) -> Any:
        plan = real(*args, **kw)
        jobs = tuple(j for j in plan.jobs if j.name.startswith("language_model."))
        return type(plan)(**{**plan.__dict__, "jobs": jobs})

    monkeypatch.setattr(merge_module, "make_plan", text_only)
    with pytest.raises(MergeError, match=r"tensor 'multi_modal_projector.linear_1.bias' of .*base would be missing"):
        run("ram", base, agents, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_written_shards_must_hold_the_planned_tensors(tmp_path: Path) -> None:
    base = am.base_model("qwen3", tmp_path / "m")
    planned = [PlannedTensor(n, t.dtype, tuple(t.shape)) for n, t in am.tensors(base).items()]
    check_written(base, planned)
    with pytest.raises(MergeError, match=r"tensor 'extra\.weight' is missing from the written shards"):
        check_written(base, [*planned, PlannedTensor("extra.weight", torch.float32, (2, 2))])
    wrong = [PlannedTensor(p.name, torch.bfloat16, p.shape) if p.name == "model.norm.weight" else p for p in planned]
    with pytest.raises(MergeError, match=r"'model\.norm\.weight' was written as torch\.float32"):
        check_written(base, wrong)


def test_fused_expert_layout_merges_and_loads(tmp_path: Path) -> None:
    """Qwen3-MoE agents saved in transformers 5's in-memory layout (each layer's experts fused into 3-D
    ``mlp.experts.gate_up_proj`` / ``down_proj``) merge as any tensor and load to the same model as the per-expert
    layout's merge."""
    base, agents, _ = am.family("qwen3_moe", tmp_path / "fam")
    legacy = run("ram", base, agents, tmp_path / "legacy")
    fused = []
    for i, folder in enumerate([base, *agents]):
        state = {k: v.contiguous() for k, v in load("qwen3_moe", folder).state_dict().items()}  # untied head
        fused.append(am.write_like(base, tmp_path / f"fused{i}", state))
    assert any(k.endswith("mlp.experts.gate_up_proj") for k in am.tensors(fused[0]))
    out = run("ram", fused[0], fused[1:], tmp_path / "out")
    assert am.tensors(out).keys() == am.tensors(fused[0]).keys()
    logits, tokens = generate(load("qwen3_moe", out))
    want_logits, want_tokens = generate(load("qwen3_moe", legacy))
    torch.testing.assert_close(logits, want_logits)
    assert torch.equal(tokens, want_tokens)
