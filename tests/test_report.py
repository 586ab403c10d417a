"""What a merge leaves for others to read: merge.json (hashes, timing, probe), the model card, the plan, plots."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml

from agentmerge import MergeConfig, ModelSpec, merge
from agentmerge.cli import main
from agentmerge.config.schema import Override
from agentmerge.engine import provenance
from agentmerge.engine.render import model_card
from agentmerge.io.formats.tensorfile import read_safetensors_header


@pytest.fixture(autouse=True)
def _private_hash_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTMERGE_CACHE", str(tmp_path / "cache"))


def _cfg(family: tuple[Path, list[Path]], method: str = "ram_plus") -> MergeConfig:
    base, agents = family
    return MergeConfig(method=method, base=str(base), models=[ModelSpec(path=str(a)) for a in agents])


def test_record_has_hashes_time_and_probe(tiny_family: tuple[Path, list[Path]], tmp_path: Path) -> None:
    base, agents = tiny_family
    merge(_cfg(tiny_family), tmp_path / "out", quiet=True, hashing="sha256")  # the default, fast: test_digests.py
    record = json.loads((tmp_path / "out" / "merge.json").read_text())
    assert set(record["inputs"]) == {str(p) for p in [base, *agents]}
    for folder, files in record["inputs"].items():
        for entry in files:
            data = (Path(folder) / entry["file"]).read_bytes()
            assert entry["sha256"] == hashlib.sha256(data).hexdigest() and entry["bytes"] == len(data)
    assert record["seconds"] > 0 and record["config"]["method"] == "ram_plus"
    assert [a["name"] for a in record["probe"]] == [a.name for a in agents]
    assert all(0 < a["density"] < 1 for a in record["probe"])


def test_model_card_front_matter(tiny_family: tuple[Path, list[Path]], tmp_path: Path) -> None:
    result = merge(_cfg(tiny_family), tmp_path / "out", quiet=True)
    text = (tmp_path / "out" / "README.md").read_text()
    assert text.startswith("---\n")
    front = yaml.safe_load(text.split("---\n")[1])
    assert "base_model" not in front and front["library_name"] == "transformers"  # a local base has no Hub id
    assert {"merge", "agentmerge", "ram_plus"} <= set(front["tags"])
    # hub ids are valid YAML strings; an awkward local path stays out of the front matter
    cfg = MergeConfig(method="ram", base="Qwen/Qwen2.5-7B-Instruct", models=[ModelSpec(path="a")])
    assert yaml.safe_load(model_card(cfg, result).split("---\n")[1])["base_model"] == "Qwen/Qwen2.5-7B-Instruct"
    cfg = MergeConfig(method="ram", base='we:ird "name"\n#x', models=[ModelSpec(path="org/a"), ModelSpec(path="b")])
    front = yaml.safe_load(model_card(cfg, result).split("---\n")[1])
    assert front["base_model"] == "org/a" and front["tags"][0] == "merge"


def test_probe_plot_is_a_png(tiny_family: tuple[Path, list[Path]], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from agentmerge import probe
    from agentmerge.engine.render import plot_probe

    base, agents = tiny_family
    plot_probe(probe(str(base), [str(a) for a in agents], quiet=True), tmp_path / "probe.png")
    data = (tmp_path / "probe.png").read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000


def test_dry_run_prints_the_plan_and_writes_nothing(
    tiny_family: tuple[Path, list[Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, agents = tiny_family
    out = tmp_path / "out"
    args = ["merge", "--method", "ram_plus", "--base", str(base), "-o", str(out), "--max-shard-size", "20KB"]
    args += [x for a in agents for x in ("--model", str(a))]
    assert main([*args, "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "dry run" in text and "shard(s)" in text and "2 pass(es)" in text and "estimate:" in text
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]
    assert main([*args, "--dry-run", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert not out.exists()
    assert main([*args, "--quiet"]) == 0
    written = sorted(p.name for p in out.glob("*.safetensors"))
    assert written == [name for name, _ in plan["shards"]]
    assert sum((out / n).stat().st_size for n in written) == plan["bytes_written"]
    n_tensors = sum(len(read_safetensors_header(out / n)) for n in written)
    assert plan["tensors_merged"] + plan["tensors_copied"] == n_tensors


def test_dry_run_reports_input_problems(tiny_family: tuple[Path, list[Path]], tmp_path: Path) -> None:
    base = tiny_family[0]
    code = main(
        [
            "merge",
            "--method",
            "ram",
            "--base",
            str(base),
            "--model",
            str(tmp_path / "nope"),
            "-o",
            str(tmp_path / "out"),
            "--dry-run",
        ]
    )
    assert code == 2 and not (tmp_path / "out").exists()


def _front(card: str) -> dict[str, object]:
    front = yaml.safe_load(card.split("---\n")[1])
    assert isinstance(front, dict)
    return front


def _recipe(card: str) -> dict[str, object]:
    """The native YAML embedded under '## Recipe'."""
    block = card.split("## Recipe\n", 1)[1].split("```yaml\n", 1)[1].split("\n```", 1)[0]
    data = yaml.safe_load(block)
    assert isinstance(data, dict)
    return data


@pytest.mark.parametrize(
    ("method", "paper"),
    [("ram", "2601.13572"), ("ram_plus", "2601.13572"), ("unique_only", "2601.13572"), ("ties", "2306.01708")],
)
def test_card_tags_name_the_paper(tmp_path: Path, method: str, paper: str) -> None:
    cfg = MergeConfig(method=method, base="org/base", models=[ModelSpec(path="org/a"), ModelSpec(path="org/b")])
    front = _front(model_card(cfg, provenance.MergeResult(tmp_path, method, {}, 1.0, 1, 1)))
    assert front["tags"] == ["merge", "agentmerge", method, f"arxiv:{paper}"]
    assert front["base_model"] == ["org/base", "org/a", "org/b"] and front["base_model_relation"] == "merge"


def test_card_without_a_paper_or_hub_inputs(tiny_family: tuple[Path, list[Path]], tmp_path: Path) -> None:
    cfg = _cfg(tiny_family, "linear")
    front = _front(model_card(cfg, provenance.MergeResult(tmp_path, "linear", {}, 1.0, 1, 1)))
    assert front["tags"] == ["merge", "agentmerge", "linear"]
    assert "base_model" not in front and "base_model_relation" not in front  # local paths are not Hub ids
    mixed = MergeConfig(method="ram", base=str(tiny_family[0]), models=[ModelSpec(path="org/a"), ModelSpec(path="b")])
    front = _front(model_card(mixed, provenance.MergeResult(tmp_path, "ram", {}, 1.0, 1, 1)))
    assert front["base_model"] == "org/a" and front["base_model_relation"] == "merge"


def test_card_embeds_the_native_recipe(tiny_family: tuple[Path, list[Path]], tmp_path: Path) -> None:
    from agentmerge.config.schema import config_from_dict

    base, agents = tiny_family
    cfg = MergeConfig(
        method="ties",
        base=str(base),
        models=[
            ModelSpec(path=str(a), weight=w, params={"density": d})
            for a, w, d in zip(agents, [1, 2, 3], [0.3, 0.5, 0.7], strict=True)
        ],
        params={"lambda": 0.8},
        overrides=[Override(pattern="*mlp*", params={"lambda": 0.5})],
        dtype="float32",
        exclude=["*norm*"],
        seed=7,
    )
    merge(cfg, tmp_path / "out", quiet=True)
    card = (tmp_path / "out" / "README.md").read_text()
    recipe = _recipe(card)
    assert "threads" not in recipe and "max_shard_size" not in recipe  # defaults are left out
    assert config_from_dict(recipe) == cfg  # the recipe is the merge's configuration, every input by absolute path
    out2 = tmp_path / "again"
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    assert main(["merge", str(tmp_path / "recipe.yaml"), str(out2), "--quiet"]) == 0
    assert (out2 / "model.safetensors").read_bytes() == (tmp_path / "out" / "model.safetensors").read_bytes()
