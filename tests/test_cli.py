"""The command line: YAML and flag forms, flags overriding the file, listing, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agentmerge.cli import main, parse_value


def test_parse_value() -> None:
    assert parse_value("0.1") == 0.1 and parse_value("3") == 3 and parse_value("true") is True
    assert parse_value("1e-5") == 1e-5 and parse_value("tensor") == "tensor"


def test_yaml_and_flags_give_the_same_merge(tiny_family: tuple[Path, list[Path]], tmp_path: Path) -> None:
    base, agents = tiny_family
    models = "\n".join(f"  - path: {a}" for a in agents)
    (tmp_path / "c.yaml").write_text(f"method: ram\nbase: {base}\nmodels:\n{models}\nparams:\n  r: 0.3\n")
    # the file says ram with r (invalid for ram); flags switch to ram_plus, where r is valid
    assert main(["merge", str(tmp_path / "c.yaml"), str(tmp_path / "a"), "--method", "ram_plus", "--quiet"]) == 0
    flags = ["merge", "--method", "ram_plus", "--base", str(base), "-o", str(tmp_path / "b"), "--param", "r=0.3"]
    assert main(flags + [x for a in agents for x in ("--model", str(a))] + ["--quiet"]) == 0
    a, b = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((tmp_path / "a" / "merge.json").read_text())["resolved_params"]["r"] == 0.3


def test_errors_are_one_line_with_exit_2(
    tiny_family: tuple[Path, list[Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, agents = tiny_family
    code = main(
        ["merge", "--method", "ram_pluss", "--base", str(base), "--model", str(agents[0]), "-o", str(tmp_path / "o")]
    )
    err = capsys.readouterr().err
    assert code == 2 and "did you mean 'ram_plus'" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()
    code = main(
        ["merge", "--method", "ram", "--base", str(base), "--model", str(tmp_path / "nope"), "-o", str(tmp_path / "o")]
    )
    assert code == 2 and "no such file or folder" in capsys.readouterr().err


def test_methods_listing(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["methods"]) == 0
    text = capsys.readouterr().out
    assert "ram_plus" in text and "rescale_factor = 1.2" in text and "epsilon = 1e-05" in text
    assert main(["methods", "--json"]) == 0
    table = json.loads(capsys.readouterr().out)
    assert table["ram_plus"]["params"]["r"]["default"] == 0.1


def test_probe_command(
    tiny_family: tuple[Path, list[Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, agents = tiny_family
    argv = ["probe", "--base", str(base), *map(str, agents), "--json", str(tmp_path / "p.json"), "--quiet"]
    assert main([*argv, "--markdown", str(tmp_path / "p.md")]) == 0
    assert "| agent0 |" in capsys.readouterr().out
    data = json.loads((tmp_path / "p.json").read_text())
    assert len(data["agents"]) == 3 and "per_layer" in data and (tmp_path / "p.md").exists()


def test_the_installed_command_runs_with_the_collector_back_on() -> None:
    """``python -m agentmerge`` (the ``agentmerge`` script) pauses the collector only while importing."""
    code = "import gc, sys; from agentmerge.__main__ import main; sys.argv = ['agentmerge', 'methods', '--json']; "
    code += "rc = main(); print(rc, gc.isenabled(), file=sys.stderr)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stderr.strip().endswith("0 True")
    assert "ram_plus" in json.loads(done.stdout)
    again = subprocess.run([sys.executable, "-m", "agentmerge", "methods"], capture_output=True, text=True)
    assert again.returncode == 0 and "ram_plus" in again.stdout
    piped = subprocess.run(
        f"'{sys.executable}' -m agentmerge methods | head -n 1", shell=True, capture_output=True, text=True
    )
    assert piped.stdout.count("\n") == 1 and "Traceback" not in piped.stderr
