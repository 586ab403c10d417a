"""`agentmerge convert-config --to mergekit`: native -> mergekit, refusals by name, and the round trip back."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentmerge.cli import main
from agentmerge.config.mergekit import from_mergekit
from agentmerge.config.mergekit_export import to_mergekit
from agentmerge.config.mergekit_names import MERGEKIT
from agentmerge.config.schema import MergeConfig, config_from_dict
from agentmerge.errors import ConfigError
from agentmerge.methods.registry import METHODS

TENSORS = ("model.layers.0.mlp.up_proj.weight", "model.layers.0.self_attn.q_proj.weight", "model.embed_tokens.weight")
MODELS = [{"path": "org/a@v1", "weight": 0.5}, {"path": "./agents/b", "weight": 1.5}, {"path": "org/c"}]

# one native config per method both tools have, away from the defaults wherever mergekit can follow
SHARED: dict[str, dict[str, Any]] = {
    "ram": {"params": {"epsilon": 1e-4}, "overrides": [{"pattern": "*mlp*", "params": {"epsilon": 1e-6}}]},
    "ram_plus": {"params": {"scope": "tensor", "r": 0.3, "alpha": 1.5, "epsilon": 2e-5}},
    "linear": {"base": None, "models": MODELS},
    "task_arithmetic": {"models": MODELS, "params": {"lambda": 0.4}},
    "ties": {
        "models": [{**m, "params": {"density": d}} for m, d in zip(MODELS, [0.2, 0.4, 0.6], strict=True)],
        "params": {"lambda": 0.9},
    },
    "dare_ties": {
        "models": MODELS,
        "params": {"p": 0.7, "lambda": 1.1},
        "overrides": [
            {"pattern": "*mlp*", "params": {"p": 0.3}},
            {"pattern": "*up_proj*", "params": {"p": 0.1, "lambda": 0.5}},
        ],
    },
    "dare_linear": {"models": [MODELS[0], {**MODELS[1], "params": {"p": 0.2}}, MODELS[2]], "params": {"p": 0.6}},
    "breadcrumbs": {"models": MODELS, "params": {"density": 0.8, "gamma": 0.05, "lambda": 0.7}},
    "della": {"models": MODELS, "params": {"p": 0.4, "eps": 0.2, "lambda": 0.6}},
    "model_stock": {},
    "slerp": {"base": None, "models": [{"path": "org/a@v1"}, {"path": "./agents/b"}], "params": {"t": 0.3}},
    "sce": {"params": {"select_topk": 0.3}, "overrides": [{"pattern": "*mlp*", "params": {"select_topk": 0.6}}]},
    "karcher": {"base": None, "params": {"max_iter": 20, "tol": 1e-6}},
    "multislerp": {"models": MODELS, "params": {"normalize_weights": False, "eps": 1e-7}},
    "nuslerp": {
        "models": [{"path": "org/a@v1", "weight": 0.3}, {"path": "./agents/b"}],
        "params": {"nuslerp_flatten": False, "nuslerp_row_wise": True},
    },
}


def native(method: str, **changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "method": method,
        "base": "org/base@main",
        "models": [{"path": "org/a@v1"}, {"path": "./agents/b"}, {"path": "org/c"}],
        "dtype": "bfloat16",
        "tokenizer_source": "org/a@v1",
    }
    doc.update(copy.deepcopy(SHARED.get(method, {})))
    doc.update(changes)
    return {k: v for k, v in doc.items() if v is not None}


def resolved(cfg: MergeConfig) -> dict[str, Any]:
    """What the merge computes from a config: per tensor, the parameters of the tensor and of every model."""
    return {
        "method": cfg.method,
        "base": cfg.base,
        "models": [(m.path, m.weight) for m in cfg.models],
        "dtype": cfg.dtype,
        "tokenizer_source": cfg.tokenizer_source,
        "tensors": {t: (cfg.tensor_params(t), cfg.model_params(t)) for t in TENSORS},
    }


def round_trip(doc: dict[str, Any]) -> tuple[MergeConfig, MergeConfig, list[str]]:
    cfg = config_from_dict(doc)
    text = to_mergekit(cfg).to_yaml()
    conv = from_mergekit(yaml.safe_load(text), "exported.yaml")
    return cfg, config_from_dict(conv.config), conv.notes


def test_every_shared_method_is_covered() -> None:
    shared = {m.target for m in MERGEKIT.values() if m.target in METHODS}
    assert shared == set(SHARED)


@pytest.mark.parametrize("method", sorted(SHARED))
def test_round_trip_gives_the_same_resolved_config(method: str) -> None:
    cfg, back, notes = round_trip(native(method))
    assert resolved(back) == resolved(cfg)
    assert not [n for n in notes if "not given" in n or "differ" in n]  # no mergekit default filled in


def test_slerp_base_is_mergekits_t0_end() -> None:
    out = to_mergekit(config_from_dict(native("slerp"))).config
    assert out["base_model"] == "org/a@v1" and out["models"] == [{"model": "./agents/b"}]
    assert out["parameters"] == {"t": 0.3}


def test_values_are_written_in_mergekits_terms() -> None:
    out = to_mergekit(config_from_dict(native("della"))).config
    assert out["merge_method"] == "della" and out["base_model"] == "org/base@main"
    assert out["parameters"] == {"density": 0.6, "epsilon": 0.1, "lambda": 0.6}  # 1 - p, eps / 2
    assert out["models"][0] == {"model": "org/a@v1", "parameters": {"weight": 0.5}}
    assert (out["dtype"], out["out_dtype"], out["tokenizer_source"]) == ("float32", "bfloat16", "org/a@v1")
    out = to_mergekit(config_from_dict(native("dare_ties"))).config
    assert out["parameters"]["normalize"] is True  # mergekit's default is false; ours is the disjoint mean
    assert out["parameters"]["density"] == [
        {"filter": "up_proj", "value": 0.9},  # the last override wins in ours, the first filter in mergekit
        {"filter": "mlp", "value": 0.7},
        {"value": 0.3},
    ]
    assert out["parameters"]["lambda"] == [{"filter": "up_proj", "value": 0.5}, {"value": 1.1}]
    ties = to_mergekit(config_from_dict(native("ties"))).config
    assert [m["parameters"]["density"] for m in ties["models"]] == [0.2, 0.4, 0.6]
    ram_plus = to_mergekit(config_from_dict(native("ram_plus"))).config
    assert ram_plus["merge_method"] == "ramplus_tl"
    assert ram_plus["parameters"] == {"epsilon": 2e-5, "r": 0.3, "alpha": 1.5}


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"method": "unique_only"}, "method 'unique_only' cannot be written for mergekit"),
        ({"method": "ram_ties"}, "method 'ram_ties' cannot be written"),
        (
            {"method": "ram_plus", "params": {"r": 0.3}},
            "params: scope = 'global' cannot be written for mergekit: its ramplus_tl fixes",
        ),
        ({"method": "ram_plus", "params": {"scope": "tensor", "form": "authors"}}, "form = 'authors'"),
        ({"method": "ram_plus", "params": {"scope": "tensor", "rescale_factor": 1.5}}, "has no such parameter"),
        ({"method": "slerp", "params": {"colinear": 0.9}}, "colinear = 0.9"),
        ({"method": "dare_ties", "params": {"density": 0.5}}, "density = 0.5 cannot be written for mergekit"),
        ({"method": "slerp", "base": "org/base"}, "slerp's base must be its first model"),
        ({"method": "ram", "include": ["*mlp*"]}, "'include' cannot be written"),
        ({"method": "ram", "exclude": ["*norm*"]}, "'exclude' cannot be written"),
        (
            {"method": "ram", "overrides": [{"pattern": "model.layers.0.*", "params": {"epsilon": 1e-6}}]},
            "overrides[0].pattern 'model.layers.0.*'",
        ),
        (
            {
                "method": "ties",
                "models": [{"path": "a", "params": {"density": 0.5}}, {"path": "b"}],
                "overrides": [{"pattern": "*mlp*", "params": {"density": 0.3}}],
            },
            "set both per model and in overrides",
        ),
        ({"method": "ram", "dtype": "float64"}, "dtype 'float64' cannot be written"),
        (
            {"method": "task_arithmetic", "overrides": [{"pattern": "*mlp*", "weights": [1.5, 0.5, 1.0]}]},
            "overrides[0].weights (per-model weights of some tensors) are not written for mergekit",
        ),
    ],
)
def test_refused_by_name(changes: dict[str, Any], needle: str) -> None:
    method = changes.pop("method")
    with pytest.raises(ConfigError) as e:
        to_mergekit(config_from_dict(native(method, **changes)), "cfg.yaml")
    assert needle in str(e.value) and str(e.value).startswith("cfg.yaml: ")


def test_fisher_is_refused(tmp_path: Path) -> None:
    doc = {"method": "fisher", "models": [{"path": "a", "fisher": "fa"}, {"path": "b", "fisher": "fb"}]}
    with pytest.raises(ConfigError, match="method 'fisher' cannot be written for mergekit"):
        to_mergekit(config_from_dict(doc))


def test_notes_say_what_is_left_out() -> None:
    doc = native("dare_linear", seed=3, max_shard_size="2GB", dtype=None)
    doc["models"][0]["name"] = "coder"
    notes = to_mergekit(config_from_dict(doc)).notes
    assert any(n.startswith("seed 3 left out") for n in notes)
    assert any("--out-shard-size" in n for n in notes) and any("coder" in n for n in notes)
    assert any(n.startswith("dtype not set") for n in notes)
    linear = to_mergekit(config_from_dict(native("linear", base="org/base"))).notes
    assert any("base org/base left out" in n for n in linear)


def test_mergekit_to_ours_to_mergekit_is_stable() -> None:
    doc = {
        "merge_method": "ties",
        "base_model": "org/base@v2",
        "models": [
            {"model": "org/a", "parameters": {"density": 0.5, "weight": 0.3}},
            {"model": "org/b", "parameters": {"density": 0.7, "weight": 0.7}},
        ],
        "parameters": {"lambda": [{"filter": "mlp", "value": 0.5}, {"value": 1.0}]},
        "dtype": "float32",
        "out_dtype": "bfloat16",
    }
    again = to_mergekit(config_from_dict(from_mergekit(doc).config)).config
    assert again == {**doc, "parameters": {**doc["parameters"]}}


def test_cli_writes_stdout_or_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ours.yaml").write_text(yaml.safe_dump(native("dare_linear")))
    assert main(["convert-config", "--to", "mergekit", "ours.yaml"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# note: seed 0 left out") and yaml.safe_load(out)["merge_method"] == "dare_linear"
    assert main(["convert-config", "--to", "mergekit", "ours.yaml", "-o", "mk.yaml"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and "agentmerge: note: seed 0" in captured.err
    assert (tmp_path / "mk.yaml").read_text() == out
    assert main(["convert-config", "mk.yaml", "-o", "back.yaml"]) == 0  # and the way back, from the file
    back = yaml.safe_load((tmp_path / "back.yaml").read_text())
    assert resolved(config_from_dict(back)) == resolved(config_from_dict(native("dare_linear")))
    assert main(["convert-config", "--to", "mergekit", "ours.yaml", "-o", "ours.yaml"]) == 2
    assert "names input ours.yaml" in capsys.readouterr().err
    (tmp_path / "u.yaml").write_text(yaml.safe_dump(native("unique_only")))
    assert main(["convert-config", "--to", "mergekit", "u.yaml"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'unique_only' cannot be written for mergekit" in err


@pytest.mark.parametrize("method", ["dare_ties", "ram_plus", "della"])
def test_the_round_trip_merges_the_same_bytes(
    tiny_family: tuple[Path, list[Path]], tmp_path: Path, method: str
) -> None:
    """ours -> mergekit -> ours, merged: byte for byte the merge of the original config."""
    from agentmerge import merge

    base, agents = tiny_family
    changes: dict[str, Any] = {
        "base": str(base),
        "models": [{"path": str(a)} for a in agents],
        "tokenizer_source": None,
        "seed": 0,
    }
    if method != "ram_plus":
        changes["models"] = [
            {"path": str(a), "weight": w, "params": {"p": p}}
            for a, w, p in zip(agents, [0.5, 1.0, 1.5], [0.3, 0.5, 0.6], strict=True)
        ]
        changes["overrides"] = [{"pattern": "*mlp*", "params": {"lambda": 0.7}}]
        changes["params"] = {"p": 0.4, "lambda": 0.9} | ({"eps": 0.1} if method == "della" else {})
    cfg, back, _ = round_trip(native(method, **changes))
    merge(cfg, tmp_path / "ours", quiet=True)
    merge(back, tmp_path / "back", quiet=True)
    for f in sorted((tmp_path / "ours").glob("*.safetensors")):
        assert f.read_bytes() == (tmp_path / "back" / f.name).read_bytes(), f.name


def test_a_lora_adapter_is_written_as_model_plus_lora(tmp_path: Path) -> None:
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    models = [{"path": str(adapter)}, {"path": "org/b"}]
    cfg = config_from_dict({"method": "ties", "base": "org/base@v1", "models": models})
    exported = to_mergekit(cfg)
    assert [m["model"] for m in exported.config["models"]] == [f"org/base@v1+{adapter}", "org/b"]
    assert any("LoRA adapter" in n for n in exported.notes)
    back = from_mergekit(yaml.safe_load(exported.to_yaml())).config
    assert [m["path"] for m in back["models"]] == [f"org/base@v1+{adapter}", "org/b"]  # the same adapter on the base


def test_weights_are_written_where_mergekit_requires_them() -> None:
    for method in ("multislerp", "nuslerp"):
        doc = native(method, models=[{"path": "org/a"}, {"path": "org/b"}])
        out = to_mergekit(config_from_dict(doc)).config
        assert [m["parameters"]["weight"] for m in out["models"]] == [1.0, 1.0]


def test_karcher_base_is_left_out_with_a_note() -> None:
    conv = to_mergekit(config_from_dict(native("karcher", base="org/base")))
    assert "base_model" not in conv.config
    assert any("would average base_model in" in n for n in conv.notes)
