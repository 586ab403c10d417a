"""Parameters typed at the edge: one grammar of ``--param`` for every command, the config's records resolved once
(no override leaks into the merge's own parameters), the probe reading RAM+'s record (``form`` included)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from agentmerge.cli import build_parser, main
from agentmerge.cli.merging import merge_config_data
from agentmerge.cli.moe_lora import moe_data
from agentmerge.config import param_table
from agentmerge.config.mergekit_export import to_mergekit
from agentmerge.config.schema import config_from_dict
from agentmerge.errors import ConfigError
from agentmerge.methods import MethodParams, Param, RamPlusParams
from agentmerge.paramtext import parse_value

# --------------------------------------------------------------------------- one grammar

GRAMMAR = [
    ("no", "no"),
    ("yes", "yes"),
    ("off", "off"),
    ("on", "on"),
    ("true", True),
    ("FALSE", False),
    ("1e-3", 0.001),
    ("3", 3),
    ("-2", -2),
    (".5", 0.5),
    ("2.", 2.0),
    (" 0.25 ", 0.25),
    ("inf", "inf"),
    ("1_000", "1_000"),
    ("ties", "ties"),
    ("*mlp* re:attn", "*mlp* re:attn"),
    ("[a, b]", ["a", "b"]),
    ("[0.1, 2, true]", [0.1, 2, True]),
    ("[]", []),
    ("'true'", "true"),
    ('"[abc]"', "[abc]"),
    ("", ""),
]


@pytest.mark.parametrize(("text", "want"), GRAMMAR)
def test_the_grammar(text: str, want: object) -> None:
    got = parse_value(text)
    assert got == want and type(got) is type(want)


def _merge_value(text: str, tmp_path: Path) -> Any:
    args = build_parser().parse_args(
        ["merge", "--method", "ram", "--model", "a", "-o", str(tmp_path / "o"), "--param", f"x={text}"]
    )
    return merge_config_data(args)[0]["params"]["x"]


def _moe_value(text: str, tmp_path: Path) -> Any:
    argv = ["moe", "base", "--model", "a", "--prompts", "p.txt", "-o", str(tmp_path / "o"), "--param", f"x={text}"]
    return moe_data(build_parser().parse_args(argv))[0]["merge"]["params"]["x"]


@pytest.mark.parametrize(("text", "want"), GRAMMAR)
def test_merge_and_moe_read_param_values_alike(text: str, want: object, tmp_path: Path) -> None:
    """moe read ``--param`` as YAML (``no`` was False, ``[a, b]`` a YAML list); merge and moe now agree."""
    merged, moe = _merge_value(text, tmp_path), _moe_value(text, tmp_path)
    assert merged == moe == want and type(merged) is type(moe) is type(want)


def test_a_number_param_reads_text_by_the_same_grammar() -> None:
    """A YAML file leaves ``1e-3`` as text; ``Param.check`` reads it as ``--param`` does."""
    p = Param("x", 0.1, "a number", low=0.0)
    assert p.check("1e-3", "m") == 0.001 and p.check(" 2 ", "m") == 2.0
    for text in ("true", "no", "[1]", "inf"):
        with pytest.raises(ValueError, match="must be a number"):
            p.check(text, "m")


def test_bad_param_items_are_one_clear_error(tmp_path: Path) -> None:
    for bad in ("r", "=0.1"):
        args = build_parser().parse_args(["merge", "--method", "ram", "-o", str(tmp_path), "--param", bad])
        with pytest.raises(ConfigError, match="write NAME=VALUE"):
            merge_config_data(args)


def test_a_bool_parameter_given_no_is_refused_by_name(tmp_path: Path) -> None:
    data = {"method": "ties", "base": "b", "models": [{"path": "a"}, {"path": "c"}]}
    with pytest.raises(ConfigError, match="svd_embeddings' must be true or false"):
        config_from_dict({**data, "params": {"svd_embeddings": parse_value("no")}})


# --------------------------------------------------------------------------- records resolved once


def _cfg(**extra: Any) -> Any:
    data = {"method": "ties", "base": "b", "models": [{"path": "a"}, {"path": "c"}], "params": {"density": 0.3}}
    return config_from_dict({**data, **extra})


def test_an_override_of_every_tensor_does_not_leak_into_the_merge_params(
    tiny_family: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    """merge.json's resolved_params are ``params``'; an override with pattern ``*`` is a tensor group's, not them."""
    base, agents = tiny_family
    cfg = config_from_dict(
        {
            "method": "ties",
            "base": str(base),
            "models": [{"path": str(a)} for a in agents[:2]],
            "params": {"density": 0.3},
            "overrides": [{"pattern": "*", "params": {"density": 0.7}}],
        }
    )
    assert cfg.shared_params["density"] == 0.3 and cfg.tensor_params("model.norm.weight")["density"] == 0.7
    from agentmerge.engine.merge import merge

    merge(cfg, tmp_path / "out", quiet=True, hashing="none")
    record = json.loads((tmp_path / "out" / "merge.json").read_text())
    assert record["resolved_params"]["density"] == 0.3


def test_records_are_resolved_once_per_group(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _cfg(overrides=[{"pattern": "*mlp*", "params": {"density": 0.5}}], models=[
        {"path": "a", "params": {"density": 0.4}}, {"path": "c"}
    ])  # fmt: skip
    calls = []
    real = param_table.resolve_record
    monkeypatch.setattr(param_table, "resolve_record", lambda *a: calls.append(a) or real(*a))
    names = [f"model.layers.{i}.{kind}.weight" for i in range(50) for kind in ("mlp.up", "attn.q")]
    records = {name: cfg.tensor_params(name) for name in names}
    models = {name: cfg.model_params(name) for name in names}
    assert calls == []  # every group was resolved when the config was validated
    assert all(isinstance(r, MethodParams) for r in records.values())
    assert records["model.layers.0.mlp.up.weight"] is records["model.layers.49.mlp.up.weight"]
    assert records["model.layers.3.attn.q.weight"] is cfg.shared_params
    assert [m["density"] for m in models["model.layers.7.mlp.up.weight"]] == [0.4, 0.5]
    assert [m["density"] for m in models["model.layers.7.attn.q.weight"]] == [0.4, 0.3]


def test_a_group_of_several_overrides_is_resolved_once_and_checked() -> None:
    """Each override is checked alone when the config is validated; where several match, their union once."""
    cfg = config_from_dict(
        {
            "method": "ram_plus",
            "base": "b",
            "models": [{"path": "a"}, {"path": "c"}],
            "overrides": [
                {"pattern": "*up*", "params": {"scope": "pattern", "groups": "*mlp*", "r": 0.3}},
                {"pattern": "*down*", "params": {"r": 0.5}},
                {"pattern": "*gate*", "params": {"scope": "global"}},
            ],
        }
    )
    both = cfg.tensor_params("layers.0.mlp.up_down.weight")
    assert both is cfg.tensor_params("layers.1.mlp.up_down.weight") and both["r"] == 0.5
    assert both["scope"] == "pattern" and RamPlusParams.of(both) is both
    with pytest.raises(ConfigError, match=r"overrides\[0\] \('\*up\*'\), overrides\[2\] .*read only with scope"):
        cfg.tensor_params("layers.0.mlp.up_gate.weight")  # groups without scope pattern


def test_mergekit_export_resolves_nothing_again(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _cfg(overrides=[{"pattern": "*mlp*", "params": {"density": 0.5}}])
    calls = []
    real = param_table.resolve_record
    monkeypatch.setattr(param_table, "resolve_record", lambda *a: calls.append(a) or real(*a))
    out = to_mergekit(cfg).config
    assert calls == [] and out["parameters"]["density"] == [{"filter": "mlp", "value": 0.5}, {"value": 0.3}]


# --------------------------------------------------------------------------- the probe reads RAM+'s record


def _probe_json(family: tuple[Path, list[Path]], tmp_path: Path, *flags: str) -> dict[str, Any]:
    base, agents = family
    out = tmp_path / "p.json"
    assert main(["probe", "--base", str(base), *map(str, agents), "--json", str(out), "--quiet", *flags]) == 0
    data: dict[str, Any] = json.loads(out.read_text())
    return data


def _rhos(data: dict[str, Any]) -> list[float]:
    return [float("inf") if a["rho"] == "inf" else a["rho"] for a in data["agents"]]


def test_the_probe_honours_form_authors(tiny_family: tuple[Path, list[Path]], tmp_path: Path) -> None:
    data = _probe_json(tiny_family, tmp_path, "--param", "form=authors", "--param", "rescale_factor=1.5")
    assert data["ram_plus"] == {"form": "authors", "r": 0.1, "alpha": 2.0, "rescale_factor": 1.5}
    want = [1.0 + 0.5 * min(max(rho, 0.0), 1.0) for rho in _rhos(data)]
    assert [a["lam"] for a in data["agents"]] == pytest.approx(want) and any(0 < rho < 1 for rho in _rhos(data))


def test_the_probe_passes_the_checked_record(
    tiny_family: tuple[Path, list[Path]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Flags and --param set the same record; the probe gets it (not the raw flags), defaults from the record."""
    import agentmerge.engine.probe as probe_module

    seen: list[Any] = []
    real = probe_module.probe
    monkeypatch.setattr(probe_module, "probe", lambda *a, **k: seen.append(k["ram"]) or real(*a, **k))
    data = _probe_json(tiny_family, tmp_path, "--r", "1", "--param", "alpha=1e-1")
    assert isinstance(seen[0], RamPlusParams) and (seen[0].r, seen[0].clip) == (
        1.0,
        0.1,
    )  # given as alpha, its old name
    assert seen[0].rescale_factor == RamPlusParams().rescale_factor and seen[0].form == "paper"
    want = [1.0 + min(max(rho, 0.0), 0.1) for rho in _rhos(data)]
    assert [a["lam"] for a in data["agents"]] == pytest.approx(want)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--param", "scope=tensor"], "--param scope: the probe reads only"),
        (["--param", "form=AUTHORS"], "--param form: probe: parameter 'form' must be one of paper, authors"),
        (["--param", "r=-1"], "--param r: probe: parameter 'r' = -1.0 is out of range"),
        (["--r", "nan"], "--r: probe: parameter 'r' must be finite"),
    ],
)
def test_probe_parameter_errors_name_the_flag(
    tiny_family: tuple[Path, list[Path]], flags: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    base, agents = tiny_family
    assert main(["probe", "--base", str(base), *map(str, agents), *flags]) == 2
    assert says in capsys.readouterr().err


def test_a_copy_with_new_params_gets_new_records() -> None:
    cfg = _cfg(overrides=[{"pattern": "*mlp*", "params": {"density": 0.5}}])
    again = cfg.model_copy(update={"params": {"density": 0.6}})
    assert again.shared_params["density"] == 0.6 and again.tensor_params("mlp")["density"] == 0.5
    assert again.tensor_params("attn")["density"] == 0.6 and cfg.shared_params["density"] == 0.3
    with pytest.raises(ValueError, match="density"):
        cfg.model_copy(update={"params": {"density": 2.0}})


@pytest.mark.parametrize("method", ["ram_plus", "tsv", "ties"])
def test_a_config_pickles_with_its_records(method: str) -> None:
    """The records travel with the config (e.g. to a worker process); the table names its method, holds no hooks."""
    cfg = config_from_dict(
        {
            "method": method,
            "base": "b",
            "models": [{"path": "a"}, {"path": "c"}],
            "overrides": [{"pattern": "*mlp*", "params": {"lines_beta": 0.5}}],
        }
    )
    again = pickle.loads(pickle.dumps(cfg))
    assert again.tensor_params("x.mlp.w") == cfg.tensor_params("x.mlp.w") and again.shared_params == cfg.shared_params
    assert again.tensor_params("x.mlp.up_down.w")["lines_beta"] == 0.5


def test_a_list_of_numbers_is_one_clear_error(tmp_path: Path) -> None:
    flags = ["--method", "ties", "--base", "b", "--model", "a", "--model", "c", "-o", str(tmp_path / "o")]
    args = build_parser().parse_args(["merge", *flags, "--param", "density=[0.1, 0.2]"])
    with pytest.raises(ConfigError, match=r"params: density: give one value, not a list \(\[0.1, 0.2\]\)"):
        config_from_dict(merge_config_data(args)[0], "flags")
    groups = _cfg(method="ram_plus", params={"scope": "pattern", "groups": parse_value("[*mlp*, re:attn]")})
    assert groups.shared_params["groups"] == "*mlp* re:attn"
