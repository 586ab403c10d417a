"""Config validation: did-you-mean for typos, ranges, per-tensor overrides, include/exclude."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from agentmerge.config.schema import MergeConfig, ModelSpec, config_from_dict, load_config
from agentmerge.errors import ConfigError


def cfg(**kw: object) -> dict[str, object]:
    return {"method": "ram_plus", "base": "b", "models": [{"path": "a1"}, {"path": "a2"}], **kw}


@pytest.mark.parametrize(
    "data,message",
    [
        (cfg(method="ram_pluss"), "did you mean 'ram_plus'"),
        (cfg(params={"alhpa": 1.0}), "did you mean 'alpha'"),
        (cfg(params={"r": -1}), "out of range"),
        (cfg(params={"scope": "row"}), "must be one of global, tensor, layer, module, pattern"),
        (cfg(params={"epsilon": "tiny"}), "must be a number"),
        (cfg(modles=[]), "did you mean 'models'"),
        (cfg(models=[{"path": "a", "wieght": 2}]), "did you mean 'weight'"),
        (cfg(models=[{"path": "a", "weight": 2.0}]), "does not use model weights"),
        (cfg(method="unique_only", params={"agent": 2}), "only 2 models"),
        (cfg(dtype="float8"), "unknown dtype"),
        (cfg(max_shard_size="big"), "cannot read size"),
        (cfg(base=None), "needs a base model"),
        (cfg(models=[]), "models"),
    ],
)
def test_bad_configs_are_explained(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config_from_dict(data)


def test_yaml_numbers_and_bare_model_paths(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("method: ram_plus\nbase: b\nmodels: [a1, a2]\nparams: {epsilon: 1e-6, r: 0.2}\n")
    c = config_from_dict(load_config(tmp_path / "c.yaml"))
    assert [m.path for m in c.models] == ["a1", "a2"]
    assert c.tensor_params("x")["epsilon"] == 1e-6 and c.tensor_params("x")["r"] == 0.2


def test_overrides_and_selection() -> None:
    c = config_from_dict(
        cfg(
            params={"r": 0.2},
            overrides=[{"pattern": "*mlp*", "params": {"r": 0.5}}, {"pattern": "*down*", "params": {"alpha": 1.0}}],
            include=["model.*"],
            exclude=["*norm*"],
        )
    )
    assert c.tensor_params("model.layers.0.self_attn.q_proj.weight")["r"] == 0.2
    mlp = c.tensor_params("model.layers.0.mlp.down_proj.weight")
    assert mlp["r"] == 0.5 and mlp["clip"] == 1.0  # given as alpha, its old name
    assert c.selected("model.layers.0.mlp.up_proj.weight")
    assert not c.selected("model.norm.weight") and not c.selected("lm_head.weight")


def test_config_is_frozen() -> None:
    c = MergeConfig(method="ram", base="b", models=[ModelSpec(path="a")])
    with pytest.raises(ValidationError):
        c.method = "linear"  # type: ignore[misc]


def test_a_deprecated_key_loads_with_a_note(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``allow_dtype_mismatch`` (read nowhere since mixed floating dtypes are always accepted) still loads."""
    from agentmerge.cli.merging import _read_config_file
    from agentmerge.config.schema import read_config

    path = tmp_path / "old.yaml"
    path.write_text("method: ram\nbase: b\nmodels: [a1, a2]\nallow_dtype_mismatch: true\n")
    data, notes = read_config(path)
    assert "allow_dtype_mismatch" not in data and notes == [
        "allow_dtype_mismatch has no effect (models in another floating dtype than the base's are always "
        "accepted); remove it"
    ]
    assert config_from_dict(data) == config_from_dict({**data, "allow_dtype_mismatch": False})
    _read_config_file(str(path))
    assert f"agentmerge: note: {path}: allow_dtype_mismatch has no effect" in capsys.readouterr().err
    with pytest.raises(ValidationError):
        MergeConfig.model_validate({**data, "allow_dtype_mismatch": True})  # the model itself no longer has it
