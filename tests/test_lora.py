"""PEFT LoRA adapters as models: a merge of an adapter equals peft's merge_and_unload, up to bf16 rounding."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from agentmerge import MergeConfig, ModelSpec, merge, probe
from agentmerge.errors import AgentMergeError

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")


def tiny_llama(folder: Path, seed: int = 0) -> Any:
    """A tiny Llama saved in bf16 (untied head, so that modules_to_save can replace it)."""
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    return model


def make_adapter(base: Path, out: Path, seed: int = 1, **lora: Any) -> Path:
    """A LoRA adapter on ``base`` with random (nonzero) A and B, saved by peft."""
    model = transformers.AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32)
    options = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj", "down_proj"], **lora}
    peft_model = peft.get_peft_model(model, peft.LoraConfig(**options))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
            elif "modules_to_save" in name:  # a fully trained module, saved whole
                p.add_(torch.randn(p.shape, generator=g) * 0.01)
    peft_model.save_pretrained(out)
    return out


def merged_by_peft(base: Path, adapter: Path) -> dict[str, torch.Tensor]:
    """peft's merge_and_unload in float32: the exact merged weights, before any rounding to bf16."""
    model = transformers.AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32)
    merged = peft.PeftModel.from_pretrained(model, adapter).merge_and_unload()
    return {k: v.detach() for k, v in merged.state_dict().items()}


def ours(base: Path, models: list[str], out: Path, **kw: Any) -> dict[str, torch.Tensor]:
    cfg = MergeConfig(method="task_arithmetic", base=str(base), models=[ModelSpec(path=m) for m in models], **kw)  # type: ignore[arg-type]
    merge(cfg, out, quiet=True)
    return load_file(str(out / "model.safetensors"))


def assert_within_one_bf16_rounding(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    """``got`` (bf16) is the float32 ``want`` rounded once: within one bf16 unit in the last place of it."""
    for name, w in want.items():
        g = got[name]
        assert g.dtype == torch.bfloat16 and g.shape == w.shape, name
        ulp = torch.finfo(torch.bfloat16).eps * w.abs().clamp(min=2.0**-120)
        assert bool(((g.float() - w).abs() <= ulp).all()), name


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("lora") / "base"
    tiny_llama(folder)
    return folder


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"use_rslora": True},
        {"rank_pattern": {"v_proj": 2}, "alpha_pattern": {"down_proj": 3}},
        {"target_modules": ["q_proj", "embed_tokens"]},
        {"modules_to_save": ["lm_head"]},
    ],
)
def test_adapter_merge_equals_merge_and_unload(base: Path, tmp_path: Path, options: dict[str, Any]) -> None:
    adapter = make_adapter(base, tmp_path / "adapter", **options)
    want = merged_by_peft(base, adapter)
    got = ours(base, [str(adapter)], tmp_path / "out")
    assert_within_one_bf16_rounding(got, want)
    changed = {n for n, t in got.items() if not torch.equal(t, load_file(str(base / "model.safetensors"))[n])}
    assert changed  # the adapter did something
    if "modules_to_save" in options:
        assert "lm_head.weight" in changed


def test_adapter_reads_are_chunk_independent(base: Path, tmp_path: Path) -> None:
    adapter = make_adapter(base, tmp_path / "adapter", target_modules=["q_proj", "down_proj", "embed_tokens"])
    whole = ours(base, [str(adapter)], tmp_path / "a")
    pieces = ours(base, [str(adapter)], tmp_path / "b", chunk_size=37)
    assert all(torch.equal(whole[n], pieces[n]) for n in whole)


def test_two_adapters_and_a_full_model_merge_with_ram(base: Path, tmp_path: Path) -> None:
    a1 = make_adapter(base, tmp_path / "a1", seed=1)
    a2 = make_adapter(base, tmp_path / "a2", seed=2, target_modules=["k_proj", "up_proj"])
    cfg = MergeConfig(method="ram", base=str(base), models=[ModelSpec(path=str(a1)), ModelSpec(path=str(a2))])
    merge(cfg, tmp_path / "out", quiet=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    ids = model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=4, do_sample=False)
    assert ids.shape == (1, 7)
    result = probe(str(base), [str(a1), str(a2)], quiet=True)
    assert all(0 < a.density < 1 for a in result.agents)  # only the target modules moved


def test_model_plus_adapter_applies_the_adapter_to_that_model(base: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    tiny_llama(other, seed=5)
    adapter = make_adapter(base, tmp_path / "adapter")
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = None  # trained elsewhere; applied to `other` on purpose
    (adapter / "adapter_config.json").write_text(json.dumps(cfg))
    want = merged_by_peft(other, adapter)
    got = ours(base, [f"{other}+{adapter}"], tmp_path / "out")  # base + (other + adapter - base)
    assert_within_one_bf16_rounding(got, want)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"use_dora": True}, "DoRA adapters are not supported"),
        ({"peft_type": "IA3"}, "IA3 adapters are not supported"),
        ({"r": 0}, "r must be a positive integer"),
    ],
)
def test_unsupported_adapters_are_refused_by_name(
    base: Path, tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    adapter = make_adapter(base, tmp_path / "adapter")
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**cfg, **change}))
    with pytest.raises(AgentMergeError, match=message):
        ours(base, [str(adapter)], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_adapter_needs_its_own_base(base: Path, tmp_path: Path) -> None:
    adapter = make_adapter(base, tmp_path / "adapter")
    other = tmp_path / "other"
    tiny_llama(other, seed=3)
    with pytest.raises(AgentMergeError, match="this adapter was trained on"):
        ours(other, [str(adapter)], tmp_path / "out")
    cfg = MergeConfig(method="linear", models=[ModelSpec(path=str(adapter)), ModelSpec(path=str(adapter))])
    with pytest.raises(AgentMergeError, match="pass the base"):
        merge(cfg, tmp_path / "out2", quiet=True)


def test_adapter_tensors_that_fit_nothing_are_refused(base: Path, tmp_path: Path) -> None:
    adapter = make_adapter(base, tmp_path / "adapter")
    weights = load_file(str(adapter / "adapter_model.safetensors"))
    weights["base_model.model.model.layers.0.mystery.weight"] = torch.zeros(3)
    save_file(weights, str(adapter / "adapter_model.safetensors"))
    with pytest.raises(AgentMergeError, match="matches no tensor of the base model"):
        ours(base, [str(adapter)], tmp_path / "out")


def test_pickled_adapter_is_read_safely(base: Path, tmp_path: Path) -> None:
    adapter = make_adapter(base, tmp_path / "adapter")
    want = ours(base, [str(adapter)], tmp_path / "a")
    weights = load_file(str(adapter / "adapter_model.safetensors"))
    (adapter / "adapter_model.safetensors").unlink()
    torch.save(weights, adapter / "adapter_model.bin")
    got = ours(base, [str(adapter)], tmp_path / "b")
    assert all(torch.equal(want[n], got[n]) for n in want)
