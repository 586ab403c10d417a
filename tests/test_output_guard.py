"""No command writes over an input (issue 42): every subcommand, every output flag, every input file.

The test walks the real parser (the plug-ins' commands included) instead of a list of commands, so a command
added later is covered without editing this file:

- each value-taking argument whose name says it is a path (``--out``, ``--json``, ``--base``, ``src``...) must be
  declared with ``io.guards.pathargs.input_arg`` / ``output_arg``; an undeclared one fails here;
- each declared output is pointed at every file of a tiny model folder (weights, config, tokenizer, index) and
  of a tiny LoRA adapter (adapter config and weights) given to each declared input, at an input file itself,
  and into the command's own output folder; each must be refused by ``main`` in one line, status 2, before the
  command runs, with every input's bytes unchanged.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

import agentmerge.cli as cli_module
from agentmerge.cli import build_parser, main
from agentmerge.io.guards.pathargs import ROLES, PathRole, check_paths
from hostile import model_folder

PATHLIKE = re.compile(
    r"^(out|output|json_out|json|markdown|plot|docs|dst|log_samples|base|model|models|agents|checkpoint|"
    r"checkpoints|src|source|config|static|fisher|merged|tokenizer|tokenizer_source|model_files|prompts|tasks|"
    r"texts|include_path|wheel|zoo)$"
)
NOT_PATHS = {("lm-eval", "tasks")}  # lm-eval task names, not a file
MODEL_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json", "tokenizer.json",
               "tokenizer_config.json", "generation_config.json")  # fmt: skip
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


class NotRefused(BaseException):
    """The guard let a case through: stop before the command itself runs."""


def leaves(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:  # fmt: skip
    """``(command words, parser)`` of every runnable subcommand, nested ones (``zoo real run``) included."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs and parser.get_default("func") is not None:
        yield words, parser
    for action in subs:
        seen: set[int] = set()
        for name, sub in action.choices.items():
            if id(sub) not in seen:
                seen.add(id(sub))
                yield from leaves(sub, (*words, name))


COMMANDS = list(leaves(build_parser()))


def _roles(p: argparse.ArgumentParser) -> list[PathRole]:
    return list(p.get_default(ROLES) or [])


def test_the_walk_sees_every_command_and_the_plugins() -> None:
    names = {" ".join(w) for w, _ in COMMANDS}
    for expected in ("merge", "probe", "converge", "convert-config", "extract-lora", "moe", "eval", "zoo bench",
                     "zoo real pilot"):  # fmt: skip
        assert expected in names, names
    assert len(names) >= 20


@pytest.mark.parametrize("words,parser", COMMANDS, ids=[" ".join(w) for w, _ in COMMANDS])
def test_every_path_argument_is_declared(words: tuple[str, ...], parser: argparse.ArgumentParser) -> None:
    declared = {r.dest for r in _roles(parser)}
    undeclared = [
        a.dest
        for a in parser._actions
        if a.nargs != 0 and not isinstance(a, argparse._SubParsersAction) and PATHLIKE.match(a.dest)
        and a.dest not in declared and (" ".join(words), a.dest) not in NOT_PATHS
    ]  # fmt: skip
    assert not undeclared, (
        f"{' '.join(words)}: declare {undeclared} with input_arg / output_arg (io/guards/pathargs.py)"
    )


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("inputs")
    model = model_folder(root / "model", 0)
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {}}))
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        (model / name).write_text("{}")
    adapter = root / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 1}))
    (adapter / "adapter_model.safetensors").write_bytes((model / "model.safetensors").read_bytes())
    other = model_folder(root / "other", 1)
    config = root / "input.yaml"
    config.write_text(yaml.safe_dump({"method": "linear", "base": str(other), "models": [{"path": str(other)}]}))
    return {"model": model, "adapter": adapter, "other": other, "file": config}


def _digests(root: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def _filler(action: argparse.Action, tmp: Path) -> list[str]:
    """A value argparse accepts for an argument the case does not test (the guard runs before it is used)."""
    if action.choices:
        return [str(next(iter(action.choices)))]
    if action.type in (int, float):
        return ["1"]
    return [str(tmp / f"unused-{action.dest}")]


def _argv(
    words: tuple[str, ...], parser: argparse.ArgumentParser, values: dict[str, str], tmp: Path, other: dict[str, Path]
) -> list[str]:
    """The command line: ``values`` for the tested arguments, fillers for the other required ones."""
    roles = {r.dest: r for r in _roles(parser)}
    required = {a.dest for g in parser._mutually_exclusive_groups if g.required for a in g._group_actions[:1]}
    positional, optional = [], []
    for a in parser._actions:
        if isinstance(a, argparse._HelpAction) or a.nargs == 0:
            continue
        if a.dest in values:
            given = [values[a.dest]]
        elif a.required or a.dest in required or not a.option_strings:
            role = roles.get(a.dest)
            given = [str(other[role.role])] if role and role.role in other else _filler(a, tmp)
        else:
            continue
        if a.option_strings:
            optional += [a.option_strings[-1], *given]
        else:
            positional += given
    return [*words, *positional, *optional]


def _cases(parser: argparse.ArgumentParser, inputs: dict[str, Path], tmp: Path) -> Iterator[dict[str, str]]:
    """``{dest: value}`` of each case: an output over an input, or inside the command's own output folder."""
    roles = _roles(parser)
    outs = [r for r in roles if r.role.startswith("out-")]
    for out in outs:
        for inp in (r for r in roles if r.role == "model"):
            for folder, names in ((inputs["model"], MODEL_FILES), (inputs["adapter"], ADAPTER_FILES)):
                targets = [folder / n for n in names] if out.role == "out-file" else [folder, folder / "sub"]
                for target in targets:
                    yield {inp.dest: str(folder), out.dest: str(target)}
        for inp in (r for r in roles if r.role == "file"):
            yield {inp.dest: str(inputs["file"]), out.dest: str(inputs["file"])}
        if out.role == "out-file":
            for folder_role in (r for r in outs if r.role in ("out-folder", "out-into")):
                own = tmp / "own-output"
                own.mkdir(exist_ok=True)
                yield {folder_role.dest: str(own), out.dest: str(own / "adapter_config.json")}
                yield {folder_role.dest: str(own), out.dest: str(own)}


@pytest.mark.parametrize("words,parser", COMMANDS, ids=[" ".join(w) for w, _ in COMMANDS])
def test_no_output_flag_writes_over_an_input(
    words: tuple[str, ...],
    parser: argparse.ArgumentParser,
    inputs: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def guard_or_stop(args: argparse.Namespace) -> None:
        check_paths(args)
        raise NotRefused(" ".join(words))

    monkeypatch.setattr(cli_module, "check_paths", guard_or_stop)
    monkeypatch.chdir(tmp_path)
    other = {"model": inputs["other"], "file": inputs["file"]}
    before = _digests(inputs["model"].parent)
    cases = list(_cases(parser, inputs, tmp_path))
    for values in cases:
        argv = _argv(words, parser, values, tmp_path, other)
        try:
            status = main(argv)
        except NotRefused:
            pytest.fail(f"not refused: agentmerge {' '.join(argv)}")
        err = capsys.readouterr().err
        lines = [x for x in err.splitlines() if x.startswith("agentmerge: error")]
        assert status == 2 and len(lines) == 1 and "Traceback" not in err, (argv, err)
    assert _digests(inputs["model"].parent) == before
    if not any(r.role.startswith("out-") for r in _roles(parser)):
        assert cases == []  # a command without outputs (methods, eval --suite) has nothing to refuse


# --------------------------------------------------------------------------- the audit's cases, end to end


def test_converge_json_never_replaces_an_input(
    inputs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``converge --json BASE/config.json`` (or an agent's weights, or its own task file) is refused, not written."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"prompt": "1+1=", "reference": "2"}\n')
    before = {**_digests(inputs["model"].parent), **_digests(tmp_path)}
    model, other = inputs["model"], inputs["other"]
    for target in (model / "config.json", other / "model.safetensors", tasks):
        argv = ["converge", str(model), str(other), "--evaluate", f"tasks:{tasks}", "--json", str(target), "--quiet"]
        assert main(argv) == 2
        assert "--json" in capsys.readouterr().err
    assert {**_digests(inputs["model"].parent), **_digests(tmp_path)} == before


def test_convert_config_never_replaces_a_file_of_a_model_it_names(
    inputs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "native.yaml"
    config.write_text(yaml.safe_dump({"method": "task_arithmetic", "base": str(inputs["model"]),
                                      "models": [{"path": str(inputs["other"])}]}))  # fmt: skip
    before = _digests(inputs["model"].parent)
    for target in (inputs["model"] / "config.json", inputs["other"] / "model.safetensors", config):
        assert main(["convert-config", "--to", "mergekit", str(config), "-o", str(target)]) == 2
        assert "-o" in capsys.readouterr().err
    assert _digests(inputs["model"].parent) == before
    assert main(["convert-config", "--to", "mergekit", str(config), "-o", str(tmp_path / "mk.yaml")]) == 0
    assert yaml.safe_load((tmp_path / "mk.yaml").read_text())["merge_method"] == "task_arithmetic"


@pytest.mark.parametrize("how", ["symlink", "hardlink"])
def test_a_link_to_an_input_is_refused_too(
    how: str, inputs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    weights = inputs["model"] / "model.safetensors"
    link = tmp_path / "report.json"
    link.symlink_to(weights) if how == "symlink" else link.hardlink_to(weights)
    before = weights.read_bytes()
    argv = ["probe", "--base", str(inputs["other"]), str(inputs["model"]), "--json", str(link), "--quiet"]
    assert main(argv) == 2
    assert "input folder" in capsys.readouterr().err
    assert weights.read_bytes() == before


def test_two_output_flags_naming_one_file_are_refused(
    inputs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    same = str(tmp_path / "report.txt")
    argv = ["probe", "--base", str(inputs["model"]), str(inputs["other"]), "--json", same, "--markdown", same]
    assert main(argv) == 2
    assert "name the same file" in capsys.readouterr().err


def test_model_plus_adapter_protects_both_parts(
    inputs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ref = f"{inputs['other']}+{inputs['adapter']}"
    for target in (inputs["adapter"] / "adapter_config.json", inputs["other"] / "config.json"):
        argv = ["probe", "--base", str(inputs["model"]), ref, "--json", str(target)]
        assert main(argv) == 2
        assert "--json" in capsys.readouterr().err


def test_sweep_out_never_lies_inside_a_model_its_file_names(
    inputs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({"base": str(inputs["model"]), "models": [str(inputs["other"])],
                                     "methods": {"task_arithmetic": {}}, "evaluate": "tasks:t.jsonl"}))  # fmt: skip
    before = _digests(inputs["model"].parent)
    for out in (inputs["model"], inputs["other"] / "results"):
        assert main(["sweep", str(sweep), "--out", str(out)]) == 2
        assert "--out" in capsys.readouterr().err
    assert _digests(inputs["model"].parent) == before


def test_extract_lora_json_never_replaces_the_adapters_own_config(
    inputs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``-o AD --json AD/adapter_config.json`` with AD an empty folder: the report replaced the adapter's config."""
    adapter = tmp_path / "ad"
    adapter.mkdir()
    argv = ["extract-lora", str(inputs["model"]), "--base", str(inputs["other"]), "-o", str(adapter), "--rank", "2"]
    assert main([*argv, "--json", str(adapter / "adapter_config.json")]) == 2
    assert "inside the output folder" in capsys.readouterr().err
    assert list(adapter.iterdir()) == []
