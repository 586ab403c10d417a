"""One name per idea: the output scale is ``scale`` in every method, RAM+'s bound of rho is ``clip``; the older
names (``lambda``, TSV's ``alpha``, RAM+'s ``alpha``) are aliases accepted on input and kept in mergekit YAML."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest

from agentmerge import MergeConfig, ModelSpec, merge
from agentmerge.config.mergekit import from_mergekit
from agentmerge.config.mergekit_export import to_mergekit
from agentmerge.config.schema import config_from_dict
from agentmerge.methods import METHODS, RamPlusParams, TaskArithmeticParams, TsvParams
from agentmerge.methods.lines import closed_form_alpha
from agentmerge.synthetic import write_family


def test_every_output_scale_is_called_scale() -> None:
    scales = {m.name: m.output_scale for m in METHODS.values() if m.output_scale is not None}
    assert set(scales.values()) == {"scale"}
    assert {"task_arithmetic", "ties", "dare_linear", "magmax", "tsv", "iso_c", "ram"} <= set(scales)
    assert all(m.param("scale") is not None for m in METHODS.values() if m.name in scales)


@pytest.mark.parametrize(
    ("method", "old", "new"),
    [
        ("task_arithmetic", "lambda", "scale"),
        ("ties", "lambda", "scale"),
        ("tsv", "alpha", "scale"),
        ("ram_plus", "alpha", "clip"),
        ("ram_fisher", "alpha", "clip"),
    ],
)
def test_an_old_name_is_read_as_the_new_one(method: str, old: str, new: str) -> None:
    m = METHODS[method]
    assert m.param(old) is m.param(new) is not None and old in m.names()
    assert m.canonical({old: 0.25, "seed": 1}) == {new: 0.25, "seed": 1}  # unknown names kept
    assert m.canonical({new: 0.5, old: 0.25}) == {new: 0.25}  # the later one wins, as in {**params, **override}
    assert m.record.of({old: 0.25})[new] == m.record.of({new: 0.25})[new] == 0.25
    base = {"method": method, "base": "b", "models": [{"path": "a"}, {"path": "c"}]}
    if method == "ram_fisher":
        base["models"] = [{"path": "a", "fisher": "fa"}, {"path": "c", "fisher": "fc"}]
    cfg = config_from_dict({**base, "params": {old: 0.25}, "overrides": [{"pattern": "*mlp*", "params": {old: 0.5}}]})
    assert cfg.params == {new: 0.25} and cfg.overrides[0].params == {new: 0.5}
    assert cfg.tensor_params("x.mlp.w")[new] == 0.5 and old not in cfg.tensor_params("x.attn.w")


def test_records_read_the_new_field() -> None:
    assert TaskArithmeticParams.of({"lambda": 0.7}).scale == 0.7
    assert TsvParams.of({"alpha": 1.5}).scale == 1.5
    p = RamPlusParams.of({"alpha": 0.5, "r": 0.2})
    assert p.clip == 0.5 and p.unique_scale(3.0) == pytest.approx(1.1)  # 1 + r * min(rho, clip)
    assert list(TaskArithmeticParams()) == [*(q.name for q in TaskArithmeticParams.table())]  # no alias listed


def test_mergekit_keeps_its_own_names() -> None:
    doc = {"merge_method": "ties", "base_model": "B", "models": [{"model": "a"}, {"model": "b"}]}
    native = from_mergekit({**doc, "parameters": {"lambda": 0.6, "density": 0.5}}).config
    assert native["params"] == {"scale": 0.6, "density": 0.5}
    back = to_mergekit(config_from_dict(native)).config
    assert back["parameters"]["lambda"] == 0.6 and "scale" not in back["parameters"]
    ram = from_mergekit({**doc, "merge_method": "ramplus_tl", "parameters": {"alpha": 0.4}}).config
    assert ram["params"]["clip"] == 0.4
    assert to_mergekit(config_from_dict(ram)).config["parameters"]["alpha"] == 0.4


def test_lines_closed_form_matches_the_old_rule() -> None:
    """alpha = 1 / (N c) with c = lambda w (task arithmetic, equal weights) or 1/N (linear): the rule that once
    branched on the method's name, now read from the record."""
    ta, linear = METHODS["task_arithmetic"].record, METHODS["linear"].record
    for lam, w, n in [(0.7, 1.0, 3), (1.0, 0.5, 2), (0.3, 2.0, 4)]:
        c = ta.of({"scale": lam}).sum_multiple(w, n)
        assert closed_form_alpha(n, {c}) == float(Fraction(1) / (n * Fraction(lam * w)))
    assert closed_form_alpha(3, {linear.of({}).sum_multiple(1.0, 3)}) == 1.0
    assert closed_form_alpha(3, {ta.of({"scale": 0.5}).sum_multiple(1.0, 3), None}) is None
    assert METHODS["ties"].record.of({}).sum_multiple(1.0, 3) is None
    assert closed_form_alpha(2, {Fraction(0)}) is None


def test_a_merge_by_either_name_is_the_same_bytes(tmp_path: Path) -> None:
    base, agents = write_family(tmp_path, "tiny", [0.2, 0.5], seed=4)
    outs = []
    for name in ("lambda", "scale"):
        models = [ModelSpec(path=str(a)) for a in agents]
        cfg = MergeConfig(method="task_arithmetic", base=str(base), models=models, params={name: 0.6})
        merge(cfg, tmp_path / name, quiet=True, hashing="none")
        outs.append(b"".join(f.read_bytes() for f in sorted((tmp_path / name).glob("*.safetensors"))))
        record = json.loads((tmp_path / name / "merge.json").read_text())
        assert record["config"]["params"] == {"scale": 0.6}  # merge.json says the one name
    assert outs[0] == outs[1]
