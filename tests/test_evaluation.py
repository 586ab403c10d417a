"""Evaluation on the user's own tasks: the task file, the match rules, generation, roles and shares."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentmerge.cli import main
from agentmerge.evaluation.eval_report import eval_markdown
from agentmerge.evaluation.generation import Generator
from agentmerge.evaluation.scoring import EvalRun, Scores, evaluate, mean_se
from agentmerge.evaluation.taskfile import Example, TaskFileError, load_tasks
from tinylm import constant_lm


def _file(tmp_path: Path, *rows: object) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def _ex(reference: object, match: str, **kw: object) -> Example:
    return Example(task="t", prompt="p", reference=reference, match=match, **kw)  # type: ignore[arg-type]


def test_match_rules() -> None:
    assert _ex("42", "exact").score(" 42\n") and not _ex("42", "exact").score("42.")
    assert _ex("Paris", "normalised").score("  paris. ") and not _ex("Paris", "normalised").score("It is Paris")
    assert _ex("Paris", "contains").score("It is PARIS!") and not _ex("Paris", "contains").score("Lyon")
    assert _ex(r"\bcat\b", "regex").score("a cat sat") and not _ex(r"\bcat\b", "regex").score("concatenate")
    assert _ex("42", "numeric").score("17 + 25 = 42") and _ex("1000", "numeric").score("1,000.0")
    assert not _ex("42", "numeric").score("41 or 42?!  no: 43") and not _ex("42", "numeric").score("none")
    assert _ex("0.5", "numeric", tolerance=0.01).score("0.504")
    assert _ex({"a": [1, 2]}, "json").score('Sure: {"a": [1, 2]} done') and not _ex({"a": 1}, "json").score("{'a': 1}")


def test_task_file_defaults_and_order(tmp_path: Path) -> None:
    path = _file(
        tmp_path,
        {"task": "math", "prompt": "2+2?", "reference": 4},
        "// a comment, then a blank line",
        "",
        {"task": "math", "defaults": {"match": "numeric", "max_new_tokens": 8, "system": "Be brief."}},
        {"task": "json", "prompt": "give", "reference": '{"x": 1}', "match": "json"},
        {"prompt": "hi", "reference": "hello", "max_new_tokens": 3},
    )
    math_ex, json_ex, plain = load_tasks(path)
    assert (math_ex.match, math_ex.max_new_tokens, math_ex.system, math_ex.line) == ("numeric", 8, "Be brief.", 1)
    assert json_ex.reference == {"x": 1} and (plain.task, plain.match, plain.max_new_tokens) == ("default", "exact", 3)


@pytest.mark.parametrize(
    ("row", "says"),
    [
        ('{"prompt": "a", "reference": "b",}', "tasks.jsonl:1: not valid JSON"),
        ('["a"]', "tasks.jsonl:1: each line must be a JSON object"),
        ({"prompt": "a"}, "tasks.jsonl:1: field 'reference' is missing"),
        ({"prompt": "a", "reference": "b", "match": "exat"}, "field 'match' must be one of exact, normalised"),
        ({"prompt": "a", "reference": "b", "match": "exat"}, "did you mean 'exact'"),
        ({"prompt": "a", "refrence": "b"}, "unknown field 'refrence' (did you mean 'reference'?)"),
        ({"prompt": "a", "reference": "x", "match": "numeric"}, "field 'reference' must be a number"),
        ({"prompt": "a", "reference": "(", "match": "regex"}, "not a valid regular expression"),
        ({"prompt": "a", "reference": "{", "match": "json"}, "must be JSON for match json"),
        ({"prompt": "", "reference": "b"}, "field 'prompt' must be a non-empty string"),
        ({"prompt": "a", "reference": "b", "max_new_tokens": 0}, "field 'max_new_tokens'"),
        ({"task": "t", "defaults": {"mach": "exact"}}, "unknown setting 'mach' in 'defaults'"),
    ],
)
def test_task_file_mistakes_are_one_line(tmp_path: Path, row: object, says: str) -> None:
    with pytest.raises(TaskFileError) as err:
        load_tasks(_file(tmp_path, row, {"task": "ok", "prompt": "a", "reference": "b"}))
    assert says in str(err.value) and "\n" not in str(err.value)


def test_task_file_without_examples_or_with_stray_defaults(tmp_path: Path) -> None:
    with pytest.raises(TaskFileError, match="no examples"):
        load_tasks(_file(tmp_path, "// nothing"))
    with pytest.raises(TaskFileError, match="defaults for task 'mth', which has no examples"):
        load_tasks(_file(tmp_path, {"task": "math", "prompt": "a", "reference": 1}, {"task": "mth", "defaults": {}}))
    with pytest.raises(TaskFileError, match="cannot read"):
        load_tasks(tmp_path / "missing.jsonl")


def test_mean_and_standard_error() -> None:
    assert mean_se([True, False, True, False]) == (0.5, pytest.approx(0.5 / 3**0.5 * 1.0))
    assert mean_se([True]) == (1.0, 0.0)


def _scores(label: str, role: str, **mean: float) -> Scores:
    return Scores(label, label, role, True, dict(mean), dict.fromkeys(mean, 0.0), dict.fromkeys(mean, 10))


def test_share_of_gain_kept_is_on_each_specialists_own_tasks() -> None:
    run = EvalRun(
        ["a", "b", "c"],
        [
            _scores("base", "base", a=0.2, b=0.4, c=0.5),
            _scores("A", "specialist", a=0.8, b=0.4, c=0.5),
            _scores("B", "specialist", a=0.3, b=0.9, c=0.4),
            _scores("M", "merge", a=0.5, b=0.9, c=0.5),
        ],
    )
    shares = {(s["merge"], s["specialist"]): s for s in run.shares()}
    assert shares["M", "A"]["tasks"] == ["a"] and shares["M", "A"]["share"] == pytest.approx(0.5)
    assert shares["M", "B"]["tasks"] == ["b"] and shares["M", "B"]["share"] == pytest.approx(1.0)
    text = eval_markdown(run)
    assert "| a | 10 | 20.0 % ± 0.0 | 80.0 % ± 0.0 |" in text and "| M | A | a | 50 % |" in text


@pytest.fixture(scope="module")
def lms(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lms")
    return {
        "base": constant_lm(root / "base", "1"),
        "agent_a": constant_lm(root / "agent_a", "7"),
        "agent_b": constant_lm(root / "agent_b", "3"),
        "merged": constant_lm(root / "merged", "7", merged=True),
        "plain": constant_lm(root / "plain", "7", chat_template=None),
    }


def _two_tasks(tmp_path: Path) -> Path:
    rows: list[object] = [{"task": t, "defaults": {"max_new_tokens": 1}} for t in ("sevens", "threes")]
    rows += [{"task": "sevens", "prompt": f"Say seven, {i}", "reference": "7"} for i in range(5)]
    rows += [{"task": "threes", "prompt": f"Say three {i}?", "reference": "3", "match": "numeric"} for i in range(3)]
    return _file(tmp_path, *rows)


def test_evaluate_scores_roles_and_shares(lms: dict[str, Path], tmp_path: Path) -> None:
    run = evaluate([lms[k] for k in ("base", "agent_a", "agent_b", "merged")], _two_tasks(tmp_path), quiet=True)
    by = {c.label: c for c in run.checkpoints}
    assert [c.role for c in run.checkpoints] == ["base", "specialist", "specialist", "merge"]
    assert by["agent_a"].mean == {"sevens": 1.0, "threes": 0.0} and by["agent_b"].mean == {"sevens": 0.0, "threes": 1.0}
    assert by["merged"].count == {"sevens": 5, "threes": 3} and by["base"].mean["sevens"] == 0.0
    shares = {s["specialist"]: s["share"] for s in run.shares()}
    assert shares == {"agent_a": 1.0, "agent_b": 0.0}


def test_chat_template_and_system_prompt(lms: dict[str, Path]) -> None:
    ex = Example(task="t", prompt="Hi", reference="x", system="Be brief.")
    chat = Generator.load(str(lms["agent_a"]), "cpu", "float32", True)
    assert chat.text(ex) == "<system>Be brief.\n<user>Hi\n<assistant>"
    assert Generator.load(str(lms["agent_a"]), "cpu", "float32", False).text(ex) == "Be brief.\nHi"
    plain = Generator.load(str(lms["plain"]), "cpu", "float32", True)
    assert not plain.chat and plain.text(ex) == "Be brief.\nHi"


def test_eval_command(lms: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tasks = _two_tasks(tmp_path)
    argv = ["eval", str(lms["base"]), str(lms["agent_a"]), str(lms["merged"]), "--tasks", str(tasks), "--quiet"]
    assert (
        main([*argv, "--samples", "1", "--json", str(tmp_path / "e.json"), "--markdown", str(tmp_path / "e.md")]) == 0
    )
    out = capsys.readouterr().out
    assert "| sevens | 5 | 0.0 % ± 0.0 | 100.0 % ± 0.0 | 100.0 % ± 0.0 |" in out
    assert "| merged | agent_a | sevens | 100 % |" in out
    assert '**merged / sevens** (correct)\n- prompt: "Say seven, 0"\n- output: "7"\n- reference: "7"' in out
    data = json.loads((tmp_path / "e.json").read_text())
    assert data["checkpoints"][1]["accuracy"]["sevens"] == 1.0 and data["share_of_gain_kept"][0]["share"] == 1.0
    assert (tmp_path / "e.md").read_text() == out


def test_eval_command_refuses_bad_input(
    lms: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = _file(tmp_path, {"prompt": "a", "reference": "b", "match": "fuzzy"})
    assert main(["eval", str(lms["base"]), "--tasks", str(bad)]) == 2
    assert "tasks.jsonl:1: field 'match' must be one of" in capsys.readouterr().err
    assert main(["eval", str(lms["base"])]) == 2
    assert "--tasks FILE.jsonl" in capsys.readouterr().err
    assert main(["eval", str(tmp_path), "--tasks", str(_two_tasks(tmp_path))]) == 2
    assert "not a model folder" in capsys.readouterr().err
    assert main(["eval", str(lms["base"]), "--suite", "zoo", "--quiet"]) == 2
    assert "not a zoo model" in capsys.readouterr().err


def test_own_tasks_on_a_zoo_tokenizer_are_refused_when_it_cannot_read_them() -> None:
    from types import SimpleNamespace

    from agentmerge.errors import ConfigError
    from agentmerge_zoo.vocab import build_tokenizer

    gen = Generator(
        SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=None)), build_tokenizer(), False, "cpu"
    )
    gen.check_alphabet([Example(task="t", prompt="rev abc", reference="cba")])
    with pytest.raises(ConfigError, match=r"reads .P.* as its unknown token"):
        gen.check_alphabet([Example(task="t", prompt="Please reverse", reference="x", line=3)])


def test_the_documented_lookup_example_end_to_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/evaluate.md's table: build, merge with ram and linear, evaluate; averaging halves the unique skills."""
    import importlib.util
    import sys

    script = Path(__file__).parents[1] / "examples" / "lookup_models.py"
    spec = importlib.util.spec_from_file_location("lookup_models", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(sys, "argv", ["lookup_models.py", str(tmp_path)])
    module.main()
    agents = ["--model", str(tmp_path / "agent_digits"), "--model", str(tmp_path / "agent_upper")]
    for method in ("ram", "linear"):
        out = str(tmp_path / f"merged_{method}")
        assert main(["merge", "--method", method, "--base", str(tmp_path / "base"), *agents, "-o", out, "--quiet"]) == 0
    names = ["base", "agent_digits", "agent_upper", "merged_ram", "merged_linear"]
    assert main(["eval", *[str(tmp_path / n) for n in names], "--tasks", str(tmp_path / "tasks.jsonl"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "| digits | 10 | 0.0 % ± 0.0 | 100.0 % ± 0.0 | 0.0 % ± 0.0 | 100.0 % ± 0.0 | 60.0 % ± 16.3 |" in out
    assert (
        "| merged_ram | agent_upper | upper | 100 % |" in out
        and "| merged_linear | agent_upper | upper | 62 % |" in out
    )


def test_a_sweep_can_score_on_a_task_file(lms: dict[str, Path], tmp_path: Path) -> None:
    from agentmerge.errors import ConfigError
    from agentmerge.sweep.evaluators import default_objective, resolve

    tasks = _two_tasks(tmp_path)
    assert default_objective(f"tasks:{tasks.name}") == "tasks_avg"
    score = resolve(f"tasks:{tasks.name}", search_path=[str(tmp_path)])  # relative to the sweep file's folder
    assert score(lms["agent_a"]) == {"tasks.sevens": 1.0, "tasks.threes": 0.0, "tasks_avg": 0.5}
    with pytest.raises(ConfigError, match=r"tasks:FILE\.jsonl"):
        resolve("task:x.jsonl")
    with pytest.raises(TaskFileError, match="cannot read"):
        resolve("tasks:missing.jsonl", search_path=[str(tmp_path)])
