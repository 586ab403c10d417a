"""mergekit configs: translated where both tools agree, refused by name where they do not."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from agentmerge.cli import main
from agentmerge.config.mergekit import from_mergekit
from agentmerge.config.mergekit_names import MERGEKIT
from agentmerge.config.schema import config_from_dict, load_config
from agentmerge.errors import ConfigError
from agentmerge.methods.registry import METHODS

# mergekit's own documentation example (examples/linear.yml), keys and structure unchanged; only the three
# model names are replaced by local folders in the test.
MERGEKIT_LINEAR_EXAMPLE = """\
models:
  - model: psmathur/orca_mini_v3_13b
    parameters:
      weight: 1.0
  - model: WizardLM/WizardLM-13B-V1.2
    parameters:
      weight: 0.3
  - model: garage-bAInd/Platypus2-13B
    parameters:
      weight: 0.5
merge_method: linear
dtype: float16
"""
HUB_NAMES = ("psmathur/orca_mini_v3_13b", "WizardLM/WizardLM-13B-V1.2", "garage-bAInd/Platypus2-13B")


@pytest.fixture(autouse=True)
def _private_hash_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Input hashes are cached under the test's folder, not in the home directory."""
    monkeypatch.setenv("AGENTMERGE_CACHE", str(tmp_path / "hash-cache"))


def _load(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


def test_documented_linear_example_runs_unchanged(tiny_family: tuple[Path, list[Path]], tmp_path: Path) -> None:
    _, agents = tiny_family
    text = MERGEKIT_LINEAR_EXAMPLE
    for name, agent in zip(HUB_NAMES, agents, strict=True):
        text = text.replace(name, str(agent))
    (tmp_path / "mk.yaml").write_text(text)
    assert main(["merge", str(tmp_path / "mk.yaml"), str(tmp_path / "out"), "--quiet"]) == 0
    out = _load(tmp_path / "out")
    ins = [_load(a) for a in agents]
    w = torch.tensor([1.0, 0.3, 0.5])
    name = "model.layers.0.mlp.up_proj.weight"
    expect = sum(wi * m[name].float() for wi, m in zip(w, ins, strict=True)) / w.sum()
    assert out[name].dtype == torch.float16
    torch.testing.assert_close(out[name].float(), expect, atol=2e-3, rtol=1e-2)


def test_convert_config_prints_native_yaml(
    tiny_family: tuple[Path, list[Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, agents = tiny_family
    doc = {
        "merge_method": "ramplus_tl",
        "base_model": str(base),
        "models": [{"model": f"{base}/../{base.name}"}, *[{"model": str(a)} for a in agents]],  # base, spelled oddly
        "parameters": {"r": 0.2, "epsilon": 1e-5},
        "dtype": "bfloat16",
        "tokenizer_source": "base",
    }
    (tmp_path / "mk.yaml").write_text(yaml.safe_dump(doc))
    assert main(["convert-config", str(tmp_path / "mk.yaml")]) == 0
    text = capsys.readouterr().out
    native = yaml.safe_load(text)
    assert native["method"] == "ram_plus" and native["base"] == str(base)
    assert native["params"] == {"clip": 0.2, "scope": "tensor", "r": 0.2, "epsilon": 1e-5}  # mergekit alpha: our clip
    assert [m["path"] for m in native["models"]] == [str(a) for a in agents]  # the base is not merged into itself
    assert "# note:" in text
    config_from_dict(native)  # valid as a native config


def test_ramplus_tl_matches_native_tensor_scope(tiny_family: tuple[Path, list[Path]], tmp_path: Path) -> None:
    base, agents = tiny_family
    mk = {"merge_method": "ramplus_tl", "base_model": str(base), "models": [{"model": str(a)} for a in agents]}
    (tmp_path / "mk.yaml").write_text(yaml.safe_dump(mk))
    native = {"method": "ram_plus", "base": str(base), "models": [str(a) for a in agents]}
    native["params"] = {"scope": "tensor", "alpha": 0.2}
    (tmp_path / "native.yaml").write_text(yaml.safe_dump(native))
    assert main(["merge", str(tmp_path / "mk.yaml"), str(tmp_path / "a"), "--quiet"]) == 0
    assert main(["merge", str(tmp_path / "native.yaml"), str(tmp_path / "b"), "--quiet"]) == 0
    a, b = _load(tmp_path / "a"), _load(tmp_path / "b")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_load_config_detects_mergekit(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("merge_method: ram\nbase_model: b\nmodels:\n  - model: x\n  - model: y\n")
    data = load_config(tmp_path / "c.yaml")
    assert data == {"method": "ram", "base": "b", "models": [{"path": "x"}, {"path": "y"}]}


def test_linear_ignores_base_model_as_mergekit_does() -> None:
    doc = {"merge_method": "linear", "base_model": "B", "models": [{"model": "B"}, {"model": "a"}]}
    conv = from_mergekit(doc)
    assert "base" not in conv.config and [m["path"] for m in conv.config["models"]] == ["B", "a"]  # type: ignore[union-attr]
    assert any("not used" in n for n in conv.notes)


def _conv(doc: dict[str, object]) -> dict[str, object]:
    return from_mergekit(doc).config


def test_parameters_translate() -> None:
    two = [{"model": "a"}, {"model": "b"}]
    ta = _conv({"merge_method": "task_arithmetic", "base_model": "B", "models": two, "parameters": {"lambda": 0.7}})
    assert ta["params"] == {"scale": 0.7}  # mergekit's lambda is our scale
    # normalize: true is folded into the weights (task arithmetic only)
    weighted = [{"model": "a", "parameters": {"weight": 1.0}}, {"model": "b", "parameters": {"weight": 3.0}}]
    doc = {"merge_method": "task_arithmetic", "base_model": "B", "models": weighted, "parameters": {"normalize": True}}
    conv = from_mergekit(doc)
    assert [m.get("weight", 1.0) for m in conv.config["models"]] == [0.25, 0.75]  # type: ignore[union-attr]
    assert conv.notes
    # filtered global values become overrides (mergekit: first match wins; ours: last override wins)
    doc = {
        "merge_method": "task_arithmetic",
        "base_model": "B",
        "models": two,
        "parameters": {"lambda": [{"filter": "mlp", "value": 0.5}, {"filter": "attn", "value": 0.8}, {"value": 1.0}]},
    }
    out = _conv(doc)
    assert out["params"] == {"scale": 1.0}
    assert out["overrides"] == [
        {"pattern": "*attn*", "params": {"scale": 0.8}},
        {"pattern": "*mlp*", "params": {"scale": 0.5}},
    ]
    cfg = config_from_dict(out)
    assert cfg.tensor_params("model.layers.0.mlp.up_proj.weight")["scale"] == 0.5
    assert cfg.tensor_params("model.layers.0.self_attn.q_proj.weight")["scale"] == 0.8
    assert cfg.tensor_params("model.norm.weight")["scale"] == 1.0


@pytest.mark.skipif("ties" not in METHODS or "dare_ties" not in METHODS, reason="baselines not available")
def test_density_maps_to_our_names() -> None:
    models = [{"model": "a", "parameters": {"density": 0.3, "weight": 1.0}}, {"model": "b"}]
    doc = {"merge_method": "ties", "base_model": "B", "models": models, "parameters": {"density": 0.3}}
    assert _conv(doc)["params"] == {"density": 0.3}
    doc = {**doc, "merge_method": "dare_ties"}
    conv = from_mergekit(doc)
    assert conv.config["params"] == {"p": 0.7}  # mergekit keeps a fraction; ours drops one
    assert any("normalize" in n for n in conv.notes)  # mergekit sums, we take the disjoint mean: said out loud


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        ({"merge_method": "linearr", "models": [{"model": "a"}]}, "did you mean 'linear'"),
        ({"merge_method": "nearswap", "models": [{"model": "a"}]}, "no agentmerge counterpart"),
        ({"merge_method": "linear", "slices": [], "models": [{"model": "a"}]}, "'slices' is not supported"),
        ({"merge_method": "linear", "models": [{"model": "a"}], "tokenizer_source": "union"}, "union"),
        ({"merge_method": "linear", "models": [{"model": "a"}], "chat_template": "chatml"}, "chat_template"),
        ({"merge_method": "linear", "models": [{"model": "a"}], "dtyp": "float16"}, "did you mean 'dtype'"),
        (
            {"merge_method": "ram", "base_model": "B", "models": [{"model": "a", "parameters": {"density": 0.5}}]},
            "'density' is not supported for 'ram'",
        ),
        (
            {"merge_method": "ram", "base_model": "B", "models": [{"model": "a"}], "parameters": {"normalize": True}},
            "normalize",
        ),
        ({"merge_method": "linear", "models": [{"model": "a", "parameters": {"weight": [0.1, 0.9]}}]}, "gradients"),
        (
            {"merge_method": "linear", "models": [{"model": "a"}], "parameters": {"normalize": False}},
            "normalize: false is not supported",
        ),
        ({"merge_method": "linear", "models": [{"model": "org/m@a@b"}]}, "revision"),
        ({"merge_method": "ram", "base_model": "B", "models": [{"model": "B"}]}, "no models to merge"),
        ({"merge_method": "ram", "models": [{"model": "a", "weight": 1}]}, "unknown key 'weight'"),
        (
            {"merge_method": "ram", "base_model": "B", "models": [{"model": "a", "parameters": {"weight": 2}}]},
            "does not weight models",
        ),
    ],
)
def test_refused_with_a_clear_message(doc: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=None) as e:
        from_mergekit(doc, "mk.yaml")
    assert needle in str(e.value) and str(e.value).startswith("mk.yaml:")


def test_every_mapping_targets_an_existing_method_or_says_so() -> None:
    for name, mmap in MERGEKIT.items():
        doc = {"merge_method": name, "base_model": "B", "models": [{"model": "a"}, {"model": "b"}, {"model": "c"}]}
        if mmap.target not in METHODS:
            with pytest.raises(ConfigError, match="does not implement"):
                from_mergekit(doc)
        elif name != "slerp":
            assert from_mergekit(doc).config["method"] == mmap.target


@pytest.mark.skipif(not {"ties", "della", "slerp"} <= METHODS.keys(), reason="baselines not available")
def test_per_model_values_della_and_slerp() -> None:
    models = [{"model": "a", "parameters": {"density": 0.3}}, {"model": "b", "parameters": {"density": 0.6}}]
    out = _conv({"merge_method": "ties", "base_model": "B", "models": models})
    assert [m["params"] for m in out["models"]] == [{"density": 0.3}, {"density": 0.6}]  # type: ignore[union-attr]
    config_from_dict(out)
    della = {"merge_method": "della", "base_model": "B", "models": models[:1], "parameters": {"epsilon": 0.05}}
    assert _conv(della)["params"] == {"p": 0.7, "eps": 0.1}  # keep 0.3 -> drop 0.7; half-width -> full spread
    slerp = {"merge_method": "slerp", "base_model": "B", "models": [{"model": "B"}, {"model": "x"}]}
    slerp["parameters"] = {"t": 0.3}
    out = _conv(slerp)
    assert "base" not in out and [m["path"] for m in out["models"]] == ["B", "x"]  # type: ignore[union-attr]
    assert out["params"] == {"t": 0.3}


def test_model_plus_lora_references_are_translated() -> None:
    """mergekit's ``MODEL+ADAPTER`` and ``{model: ..., lora: ...}`` become one ``MODEL+ADAPTER`` model path."""
    doc = {
        "merge_method": "linear",
        "models": [{"model": "org/m+org/lora"}, {"model": {"model": {"path": "x"}, "lora": "y"}}],
    }
    conv = from_mergekit(doc, "mk.yaml")
    assert [m["path"] for m in conv.config["models"]] == ["org/m+org/lora", "x+y"]


def test_karcher_base_model_joins_as_one_more_model() -> None:
    """mergekit's planner adds a base_model the models do not list to karcher's inputs; we make it the last model."""
    conv = from_mergekit({"merge_method": "karcher", "base_model": "B", "models": [{"model": "a"}, {"model": "b"}]})
    assert "base" not in conv.config and [m["path"] for m in conv.config["models"]] == ["a", "b", "B"]
    assert any("joins 'karcher'" in n for n in conv.notes)
    listed = from_mergekit({"merge_method": "karcher", "base_model": "B", "models": [{"model": "a"}, {"model": "B"}]})
    assert [m["path"] for m in listed.config["models"]] == ["a", "B"]


def test_field_methods_take_mergekits_parameters() -> None:
    models = [{"model": "a", "parameters": {"weight": 0.3}}, {"model": "b", "parameters": {"weight": 1.0}}]
    nu = _conv(
        {"merge_method": "nuslerp", "base_model": "B", "models": models, "parameters": {"nuslerp_flatten": False}}
    )
    assert nu["params"] == {"nuslerp_flatten": False} and nu["models"][0]["weight"] == 0.3  # type: ignore[index]
    multi = _conv({"merge_method": "multislerp", "models": models, "parameters": {"normalize_weights": False}})
    assert multi["params"] == {"normalize_weights": False} and "base" not in multi
    sce = _conv({"merge_method": "sce", "base_model": "B", "models": models[1:], "parameters": {"select_topk": 0.2}})
    assert sce["params"] == {"select_topk": 0.2}
    with pytest.raises(ConfigError, match="does not weight models"):
        from_mergekit({"merge_method": "sce", "base_model": "B", "models": models})
