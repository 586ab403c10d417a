"""Plug-ins through entry points: evaluators and commands of other packages, found without the library naming them."""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from agentmerge import plugins
from agentmerge.cli import main
from agentmerge.errors import ConfigError
from agentmerge.evaluation.evaluator import Context, Evaluator, Score
from agentmerge.evaluation.kinds import evaluator_class, parse
from agentmerge.sweep.evaluators import default_objective, resolve
from agentmerge.sweep.sweepfile import sweep_from_dict
from conftest import declared_entry_points

PLUGIN = '''
import argparse
from pathlib import Path

from agentmerge.evaluation.evaluator import Evaluator, Score


class Letters(Evaluator):
    """Scores a folder by the length of its name (a stand-in for a real suite)."""

    kind = "letters"
    usage = "letters[:SCALE]"
    objective = "length"

    def __init__(self, scale=1.0):
        self.scale = scale

    @property
    def name(self):
        return f"letters:{self.scale}"

    def score(self, checkpoint):
        n = len(Path(checkpoint).name)
        return Score({"length": n * self.scale / 100}, {"length": 0.01}, {"length": n}, {"folder": str(checkpoint)})

    @classmethod
    def check_spec(cls, spec, arg):
        if arg and not arg.replace(".", "").isdigit():
            from agentmerge.errors import ConfigError

            raise ConfigError(f"evaluate: {spec!r}: SCALE is a number")

    @classmethod
    def from_spec(cls, arg, options, context):
        return cls(float(arg or 1.0))

    @classmethod
    def from_command(cls, args):
        return cls(2.0)


class NotAnEvaluator:
    kind = "odd"


def register(sub):
    p = sub.add_parser("hello", help="say hello")
    p.add_argument("--who", default="world")
    p.set_defaults(func=lambda args: print(f"hello {args.who}") or 0)
'''


class FakeEntryPoint:
    def __init__(self, name: str, value: str) -> None:
        self.name, self.value = name, value


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, dict[str, str]]:
    """A plug-in package on the path, and the installed entry points replaced by a table the test fills."""
    (tmp_path / "fakeplugin.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fakeplugin", raising=False)
    table: dict[str, dict[str, str]] = {plugins.COMMANDS: {}, plugins.EVALUATORS: {}}

    def entry_points(*, group: str) -> list[FakeEntryPoint]:
        return [FakeEntryPoint(n, v) for n, v in table.get(group, {}).items()]

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    return table


def test_an_installed_evaluator_is_a_sweep_kind_and_a_suite(
    installed: dict[str, dict[str, str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError, match=r"'letters' is not one of lm-eval:TASKS, python:MODULE:FUNCTION, tasks:"):
        parse("letters")
    installed[plugins.EVALUATORS]["letters"] = "fakeplugin:Letters"
    cls, arg = parse("letters:3")
    assert cls.kind == "letters" and arg == "3" and default_objective("letters") == "length"
    with pytest.raises(ConfigError, match="is not one of letters\\[:SCALE\\], lm-eval:TASKS"):
        parse("lettres")
    with pytest.raises(ConfigError, match="SCALE is a number"):
        parse("letters:x")
    folder = tmp_path / "abcd"
    assert resolve("letters:3")(folder) == {"length": 0.12}
    cfg = sweep_from_dict({"base": "b", "models": ["a1", "a2"], "methods": {"ram": {}}, "evaluate": "letters"})
    assert cfg.evaluate == "letters"
    with pytest.raises(ConfigError, match="the letters evaluator takes none"):
        sweep_from_dict({**cfg.model_dump(), "evaluate_options": {"n": 3}})
    assert main(["eval", str(folder), "--suite", "letters"]) == 0
    assert "length             8.00 % ± 1.00  (n=4)" in capsys.readouterr().out


def test_broken_or_foreign_plugins_are_named(installed: dict[str, dict[str, str]], capsys: Any) -> None:
    installed[plugins.EVALUATORS] |= {"gone": "no_such_module:X", "odd": "fakeplugin:NotAnEvaluator"}
    installed[plugins.EVALUATORS]["tasks"] = "fakeplugin:Letters"  # a built-in word stays the library's
    with pytest.raises(ConfigError, match=r"plug-in 'gone' of agentmerge.evaluators \(no_such_module:X\) cannot be"):
        evaluator_class("gone")
    with pytest.raises(ConfigError, match=r"'odd' .* is not an Evaluator of kind 'odd'"):
        evaluator_class("odd")
    assert evaluator_class("tasks").__module__ == "agentmerge.evaluation.scoring"
    with pytest.raises(ConfigError, match="is not one of gone, odd, lm-eval"):  # listed, by their word
        parse("nothing")
    assert main(["eval", "x", "--suite", "nothing"]) == 2
    assert (
        "eval --suite: no evaluator 'nothing' (installed: gone, odd, lm-eval, python, tasks, "
        in capsys.readouterr().err
    )
    assert main(["eval", "x", "--suite", "python"]) == 2
    assert "not a suite" in capsys.readouterr().err


def test_an_installed_command_joins_the_cli(installed: dict[str, dict[str, str]], capsys: Any) -> None:
    installed[plugins.COMMANDS] |= {"hello": "fakeplugin:register", "broken": "fakeplugin:nothing_here"}
    assert main(["hello", "--who", "you"]) == 0
    out = capsys.readouterr()
    assert out.out == "hello you\n" and "plug-in 'broken' of agentmerge.commands" in out.err  # skipped, named
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "hello" in capsys.readouterr().out


def test_a_built_in_command_reads_no_entry_points(installed: dict[str, dict[str, str]], monkeypatch: Any) -> None:
    def refuse(*, group: str) -> list[FakeEntryPoint]:
        raise AssertionError(f"entry points of {group} read for a built-in command")

    monkeypatch.setattr(importlib.metadata, "entry_points", refuse)
    assert main(["methods"]) == 0


def test_this_repositorys_entry_points_name_the_zoo_plugins() -> None:
    """pyproject.toml's entry points load, and are what the library expects of each group."""
    declared = declared_entry_points()
    assert set(declared) == {plugins.COMMANDS, plugins.EVALUATORS}
    for group, table in declared.items():
        for name, target in table.items():
            value = plugins.load(group, name, target)
            if group == plugins.EVALUATORS:
                assert isinstance(value, type) and issubclass(value, Evaluator) and value.kind == name
            else:
                sub = argparse.ArgumentParser().add_subparsers()
                value(sub)
                assert name in sub.choices
    assert plugins.entry_points(plugins.EVALUATORS)["zoo"] == declared[plugins.EVALUATORS]["zoo"]


def test_a_plain_function_is_an_evaluator(tmp_path: Path) -> None:
    from agentmerge.evaluation.pyfunction import PythonEvaluator

    def size(folder: Path) -> Mapping[str, float]:
        return {"files": float(len(list(folder.iterdir())))}

    (tmp_path / "a").write_text("x")
    evaluator = PythonEvaluator(size)
    assert evaluator.score(tmp_path) == Score({"files": 1.0}) and evaluator.name.startswith("python:")
    with pytest.raises(ConfigError, match="must return a non-empty"):
        PythonEvaluator(lambda folder: {}, "m:f").score(tmp_path)
    (tmp_path / "scorer.py").write_text("def score(folder):\n    return {'one': 1}\n")
    made = PythonEvaluator.from_spec("scorer:score", {}, Context((str(tmp_path),)))
    assert made.score(tmp_path).metrics == {"one": 1.0} and made.name == "python:scorer:score"
    with pytest.raises(ConfigError, match="has no function 'nope'"):
        PythonEvaluator.from_spec("scorer:nope", {}, Context((str(tmp_path),)))
