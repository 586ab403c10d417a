"""The output's tokenizer, chat template and generation config: one named source, EOS and template checks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from agentmerge import MergeConfig, ModelSpec, merge
from agentmerge.cli import main
from agentmerge.engine.sources import Input, chat_template, choose_sources, eos_ids, template_id
from agentmerge.errors import MergeError
from agentmerge.io.formats.vocab import VocabPlan
from vocabmodels import agent, base_model

OTHER_TEMPLATE = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{% endfor %}"


def set_eos(folder: Path, eos: int) -> Path:
    """Make ``folder``'s model end on token ``eos`` (config.json and generation_config.json)."""
    for name in ("config.json", "generation_config.json"):
        data = json.loads((folder / name).read_text())
        data["eos_token_id"] = eos
        (folder / name).write_text(json.dumps(data))
    return folder


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """base; ``a`` as the base; ``b`` ends on EOS 5; ``c`` has another chat template; ``tool`` adds tokens, EOS 5."""
    root = tmp_path_factory.mktemp("sources")
    base = base_model(root / "base")
    out = {"base": base, "a": agent(base, root / "a", seed=1)}
    out["b"] = set_eos(agent(base, root / "b", seed=2), 5)
    out["c"] = agent(base, root / "c", seed=3)
    (out["c"] / "chat_template.jinja").write_text(OTHER_TEMPLATE)
    out["tool"] = set_eos(agent(base, root / "tool", seed=4, added=("<call>",)), 5)
    return out


def config(family: dict[str, Path], names: list[str], **kw: object) -> MergeConfig:
    models = [ModelSpec(path=str(family[n]), name=n) for n in names]
    return MergeConfig(method="task_arithmetic", base=str(family["base"]), models=models, **kw)  # type: ignore[arg-type]


def record(out: Path) -> dict[str, object]:
    return json.loads((out / "merge.json").read_text())["sources"]  # type: ignore[no-any-return]


def test_eos_ids_and_templates_read(family: dict[str, Path], tmp_path: Path) -> None:
    assert eos_ids(family["a"]) == (1,) and eos_ids(family["b"]) == (5,)
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"eos_token_id": [7, 3, 7]}))
    assert eos_ids(folder) == (3, 7)  # a list, without generation_config.json
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 9}))
    assert eos_ids(folder) == (9,)  # generation_config.json wins
    assert chat_template(folder) is None
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": [{"name": "x", "template": "T"}]}))
    assert chat_template(folder) == json.dumps([{"name": "x", "template": "T"}], sort_keys=True)
    (folder / "chat_template.jinja").write_text("J")
    assert chat_template(folder) == "J"  # the .jinja file wins
    assert chat_template(family["c"]) == OTHER_TEMPLATE


def test_agreeing_inputs_take_the_base_silently(family: dict[str, Path], tmp_path: Path) -> None:
    merge(config(family, ["a"]), tmp_path / "o", quiet=True)
    rec = record(tmp_path / "o")
    assert rec["tokenizer"]["why"] == "base" and rec["warnings"] == []  # type: ignore[index]
    assert rec["eos_token_id"] == {"base": [1], "a": [1]}
    assert (tmp_path / "o" / "chat_template.jinja").read_text() == (family["base"] / "chat_template.jinja").read_text()


def test_eos_disagreement_without_a_chosen_source_refused(family: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(MergeError) as e:
        merge(config(family, ["a", "b"]), tmp_path / "o", quiet=True)
    msg = str(e.value)
    assert "EOS token ids differ (base, a: [1]; b: [5])" in msg and "tokenizer_source" in msg
    assert not (tmp_path / "o").exists()


def test_eos_disagreement_with_tokenizer_source_warns_and_uses_it(family: dict[str, Path], tmp_path: Path) -> None:
    merge(config(family, ["a", "b"], tokenizer_source=str(family["b"])), tmp_path / "o", quiet=True)
    rec = record(tmp_path / "o")
    assert rec["tokenizer"]["from"] == "b" and rec["generation_config"] == "b"  # type: ignore[index]
    assert rec["warnings"] == ["EOS token ids differ (base, a: [1]; b: [5]); the output uses b's [5]"]
    assert json.loads((tmp_path / "o" / "generation_config.json").read_text())["eos_token_id"] == 5
    cfg = json.loads((tmp_path / "o" / "config.json").read_text())
    assert cfg["eos_token_id"] == 5 and cfg["architectures"] == ["LlamaForCausalLM"]
    card = (tmp_path / "o" / "README.md").read_text()
    assert "tokenizer and chat template from b (tokenizer_source)" in card and "EOS token ids differ" in card


def test_agent_that_added_tokens_is_the_source(family: dict[str, Path], tmp_path: Path) -> None:
    merge(config(family, ["a", "tool"]), tmp_path / "o", quiet=True)
    rec = record(tmp_path / "o")
    assert rec["tokenizer"]["from"] == "tool" and rec["tokenizer"]["why"] == "added tokens"  # type: ignore[index]
    assert any(w.startswith("EOS token ids differ") for w in rec["warnings"])  # type: ignore[attr-defined]
    tok = json.loads((tmp_path / "o" / "tokenizer.json").read_text())
    assert "<call>" in [t["content"] for t in tok["added_tokens"]]


def test_tokenizer_source_without_the_added_tokens_warns(family: dict[str, Path], tmp_path: Path) -> None:
    merge(config(family, ["tool"], tokenizer_source=str(family["base"])), tmp_path / "o", quiet=True)
    warnings = record(tmp_path / "o")["warnings"]
    assert any("does not give ids" in w and "tool added" in w for w in warnings)  # type: ignore[attr-defined]


def test_template_disagreement_warns_on_stderr(
    family: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["merge", "--method", "task_arithmetic", "--base", str(family["base"]), "-o", str(tmp_path / "o")]
    assert main([*argv, "--model", str(family["a"]), "--model", str(family["c"])]) == 0
    err = capsys.readouterr().err
    want = template_id(OTHER_TEMPLATE)
    assert f"c: template {want}" in err and "the output uses base's" in err
    assert "tokenizer and chat template from base (the default), generation_config.json from base" in err


def test_choose_sources_order_and_generation_fallback(tmp_path: Path) -> None:
    folders = {}
    for name in ("base", "x", "src"):
        folders[name] = tmp_path / name
        folders[name].mkdir()
    (folders["base"] / "generation_config.json").write_text("{}")
    base, x, src = (Input(n, f) for n, f in folders.items())
    chosen = choose_sources(base, [x], src, VocabPlan())
    assert chosen.source == src and chosen.generation_config == base  # the source has none: the base's
    assert choose_sources(base, [x], None, VocabPlan(adders=(0,))).source == x
    assert choose_sources(base, [x], None, VocabPlan()).source == base


def test_same_folder_as_tokenizer_source_named_as_the_agent(family: dict[str, Path], tmp_path: Path) -> None:
    copy = tmp_path / "b-copy"
    shutil.copytree(family["b"], copy)
    merge(config(family, ["b"], tokenizer_source=str(copy)), tmp_path / "o", quiet=True)
    assert record(tmp_path / "o")["tokenizer"]["from"] == "tokenizer_source"  # type: ignore[index]
    merge(config(family, ["b"], tokenizer_source=str(family["b"])), tmp_path / "o2", quiet=True)
    assert record(tmp_path / "o2")["tokenizer"]["from"] == "b"  # type: ignore[index]


def test_tokenizer_source_base_is_a_choice(family: dict[str, Path], tmp_path: Path) -> None:
    """``tokenizer_source: base`` names the base: EOS ids that differ are then a warning, not a refusal, and the
    recipe keeps the word (not a path)."""
    merge(config(family, ["a", "b"], tokenizer_source="base"), tmp_path / "o", quiet=True)
    rec = record(tmp_path / "o")
    assert rec["tokenizer"] == {"from": "base", "folder": str(family["base"]), "why": "tokenizer_source"}
    assert rec["warnings"] == ["EOS token ids differ (base, a: [1]; b: [5]); the output uses base's [1]"]
    assert json.loads((tmp_path / "o" / "merge.json").read_text())["config"]["tokenizer_source"] == "base"


def test_tokenizer_source_index_takes_that_agents_template(
    family: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An agent's index (0: the first model; a number in YAML, digits on the command line) chooses its tokenizer
    and chat template: the output loads in transformers with it, and the warning names where each template is."""
    transformers = pytest.importorskip("transformers")
    argv = ["merge", "--method", "task_arithmetic", "--base", str(family["base"]), "-o", str(tmp_path / "o")]
    assert main([*argv, "--model", str(family["a"]), "--model", str(family["c"]), "--tokenizer-source", "1"]) == 0
    err = capsys.readouterr().err
    assert f"c: template {template_id(OTHER_TEMPLATE)} in chat_template.jinja" in err
    assert "the output uses c's" in err
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "o")
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert text == "[user] hi"  # c's template, not the base's
    merge(config(family, ["c", "a"], tokenizer_source=0), tmp_path / "o2", quiet=True)  # type: ignore[arg-type]
    assert record(tmp_path / "o2")["tokenizer"]["from"] == "c"  # type: ignore[index]
    assert (tmp_path / "o2" / "chat_template.jinja").read_text() == OTHER_TEMPLATE


def test_tokenizer_source_index_out_of_range_is_one_line(family: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match=r"tokenizer_source 2: an agent's index counts from 0, and there are 2"):
        config(family, ["a", "c"], tokenizer_source="2")


def test_differing_tokenizer_files_and_template_fields_named(family: dict[str, Path], tmp_path: Path) -> None:
    """An agent whose tokenizer_config.json differs (a field, and its template kept in the ``chat_template``
    field instead of chat_template.jinja): the warnings name the file, the field and where each template is."""
    d = tmp_path / "d"
    shutil.copytree(family["a"], d)
    (d / "chat_template.jinja").unlink()
    data = json.loads((d / "tokenizer_config.json").read_text())
    data.update(model_max_length=77, chat_template=OTHER_TEMPLATE)
    (d / "tokenizer_config.json").write_text(json.dumps(data))
    (d / "tokenizer.json").unlink()
    merge(config({**family, "d": d}, ["a", "d"]), tmp_path / "o", quiet=True)
    warnings = record(tmp_path / "o")["warnings"]
    assert warnings == [  # the output keeps the base's tokenizer and template
        f"chat templates differ (base, a: template {template_id(chat_template(family['base']))} in "
        f"chat_template.jinja; d: template {template_id(OTHER_TEMPLATE)} in tokenizer_config.json chat_template); "
        f"the output uses base's ({template_id(chat_template(family['base']))})",
        "tokenizers differ from base's, which the output uses (d: tokenizer.json (missing), "
        "tokenizer_config.json (model_max_length))",
    ]


def test_mergekit_export_writes_the_chosen_tokenizer(family: dict[str, Path]) -> None:
    """mergekit knows ``base``; an agent's index is written as that agent's folder."""
    from agentmerge.config.mergekit_export import to_mergekit

    assert to_mergekit(config(family, ["a", "c"], tokenizer_source="base")).config["tokenizer_source"] == "base"
    assert to_mergekit(config(family, ["a", "c"], tokenizer_source="1")).config["tokenizer_source"] == str(family["c"])


def test_tokenizer_differences_per_file_and_field(tmp_path: Path) -> None:
    """JSON fields one level deep, missing and extra files, load-only fields ignored; an input without any
    tokenizer file (an adapter saved alone) is not compared."""
    folders = {n: tmp_path / n for n in ("base", "x", "adapter")}
    for f in folders.values():
        f.mkdir()
    (folders["base"] / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"a": 0}, "type": "BPE"}}))
    (folders["base"] / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<e>", "is_local": True}))
    (folders["x"] / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"a": 1}, "type": "BPE"}}))
    (folders["x"] / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<e>", "is_local": False}))
    (folders["x"] / "merges.txt").write_text("a b\n")
    base, x, adapter = (Input(n, f) for n, f in folders.items())
    assert choose_sources(base, [x, adapter], None, VocabPlan()).warnings == (
        "tokenizers differ from base's, which the output uses (x: tokenizer.json (model.vocab), merges.txt (extra))",
    )
