"""Hostile ``eval`` input (issue 23): arguments, task files, match rules, and the markdown table.

Each case failed before its fix: a silent wrong result (``--limit -3``, ``--samples -1``, ``--batch-size 0``
accepted; a task name with ``|`` or a newline breaking the table), a hang (a task file that is ``/dev/zero``
or a FIFO, a 300 MB line, a user regex that backtracks catastrophically) or a traceback (deeply nested JSON
in a task line, a reference or a model's output).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.hostile import bounded_python, not_a_file, one_line_error

from agentmerge.evaluation.eval_report import eval_markdown
from agentmerge.evaluation.scoring import EvalRun, Scores, evaluate
from agentmerge.evaluation.taskfile import Example, TaskFileError, first_json, load_tasks
from tinylm import constant_lm


@pytest.fixture(scope="module")
def lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return constant_lm(tmp_path_factory.mktemp("lm") / "lm", "7")


def tasks(tmp_path: Path, *rows: object) -> Path:
    path = tmp_path / "tasks.jsonl"
    default: list[object] = [
        {"task": "t", "prompt": f"Say seven {i}", "reference": "7", "max_new_tokens": 1} for i in range(4)
    ]
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in (rows or default)) + "\n")
    return path


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--limit", "-3"), ("--limit", "0"), ("--samples", "-1"), ("--batch-size", "0"), ("--batch-size", "-2"),
     ("--max-new-tokens", "0"), ("--max-new-tokens", "-5"), ("--threads", "-1")],
)  # fmt: skip
def test_eval_counts_are_checked_before_any_model_loads(
    lm: Path, tmp_path: Path, flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    one_line_error(["eval", str(lm), "--tasks", str(tasks(tmp_path)), "--quiet", flag, value], capsys, flag, value)


@pytest.mark.parametrize(
    ("option", "value"), [("limit", -3), ("samples", -1), ("batch_size", 0), ("max_new_tokens", 0)]
)
def test_evaluate_checks_its_counts_too(lm: Path, tmp_path: Path, option: str, value: int) -> None:
    with pytest.raises(TaskFileError.__mro__[1], match=option):  # ConfigError
        evaluate([lm], tasks(tmp_path), quiet=True, **{option: value})  # type: ignore[arg-type]


def _run(*task_names: str, labels: tuple[str, ...] = ("base", "merged")) -> EvalRun:
    cks = []
    for label, role in zip(labels, ("base", "merge"), strict=False):
        s = Scores(label, label, role, True)
        for t in task_names:
            s.mean[t], s.se[t], s.count[t] = 0.5, 0.1, 4
        cks.append(s)
    return EvalRun(list(task_names), cks)


def _table_rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("|")]


def _cells(line: str) -> int:
    """Cells of a markdown table row: unescaped pipes, less the outer two."""
    return line.replace("\\|", "").count("|") - 1


def test_markdown_cells_are_escaped() -> None:
    text = eval_markdown(_run("a|b", "two\nlines", "ok", labels=("ba|se", "mer\nged")), samples=False)
    rows = _table_rows(text)
    assert len(rows) == 2 + 3 + 1  # head, rule, three tasks, the mean
    assert {_cells(r) for r in rows} == {4}, rows


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "folder"])
def test_a_task_file_that_is_not_a_regular_file_is_refused_without_reading(tmp_path: Path, kind: str) -> None:
    path = not_a_file(tmp_path / "tasks.jsonl", kind)
    out = bounded_python(
        "from agentmerge.evaluation.taskfile import load_tasks, TaskFileError\n"
        f"try:\n    load_tasks({str(path)!r})\nexcept TaskFileError as e:\n    print('refused:', e)\n",
        timeout=120,
    )
    assert "refused:" in out and "not a regular file" in out, out


def test_an_oversized_task_line_or_file_is_refused(tmp_path: Path) -> None:
    from agentmerge.evaluation import taskfile

    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps({"prompt": "x" * (taskfile.MAX_LINE_CHARS + 10), "reference": "y"}) + "\n")
    with pytest.raises(TaskFileError, match=r"tasks\.jsonl:1: a line of"):
        load_tasks(path)
    with open(path, "wb") as f:
        f.truncate(taskfile.MAX_TASK_FILE_BYTES + 1)  # sparse: no disk, no reading
    with pytest.raises(TaskFileError, match="too large for a task file"):
        load_tasks(path)


@pytest.mark.parametrize(
    "row",
    [
        "[" * 100_000 + "]" * 100_000,
        '{"prompt": "p", "reference": ' + "[" * 300 + "]" * 300 + ', "match": "json"}',
        {"prompt": "p", "reference": "[" * 100_000 + "]" * 100_000, "match": "json"},
        {"prompt": "p", "reference": "(" * 200_000, "match": "regex"},
    ],
)
def test_deeply_nested_task_lines_and_references_are_one_line(tmp_path: Path, row: object) -> None:
    with pytest.raises(TaskFileError, match=r"tasks\.jsonl:1"):
        load_tasks(tasks(tmp_path, row))


def test_a_deeply_nested_model_output_is_simply_not_json() -> None:
    ex = Example(task="t", prompt="p", reference={"a": 1}, match="json")
    assert first_json("[" * 100_000) == (False, None)
    assert not ex.score("Sure: " + "[" * 50_000 + "]" * 50_000)
    assert ex.score('Sure: {"a": 1}')


def test_a_user_regex_that_backtracks_catastrophically_has_a_time_limit(tmp_path: Path) -> None:
    path = tasks(tmp_path, {"prompt": "p", "reference": "(a|a)+$", "match": "regex"})
    out = bounded_python(
        "from agentmerge.evaluation.taskfile import load_tasks, TaskFileError\n"
        f"(ex,) = load_tasks({str(path)!r})\n"
        "print('quick:', ex.score('aaa'))\n"
        "try:\n    ex.score('a' * 60 + '!')\nexcept TaskFileError as e:\n    print('refused:', e)\n",
        timeout=120,
    )
    assert "quick: True" in out and "refused:" in out and "catastrophic backtracking" in out and "line 1" in out, out


@pytest.mark.parametrize(("config", "words"), [("[1]", "JSON object"), ("[" * 50_000, "config.json"), ("{}", "")])
def test_a_damaged_model_config_is_one_line(
    lm: Path, tmp_path: Path, config: str, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A config.json that is a list, nested past the limit, or without model_type: one line, for eval and converge
    (found by the CLI fuzz test: transformers raised a TypeError through eval)."""
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(lm, bad)
    (bad / "config.json").write_text(config)
    task_file = str(tasks(tmp_path))
    one_line_error(["eval", str(bad), "--tasks", task_file, "--quiet"], capsys, str(bad), words)
    converge = ["converge", str(lm), str(bad), "--evaluate", f"tasks:{task_file}", "--scales", "1,1.5", "--quiet"]
    one_line_error(converge, capsys, str(bad), words)
