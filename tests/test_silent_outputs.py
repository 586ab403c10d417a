"""Wrong results with exit status 0 (issue 42): quoted booleans, an evaluator that exits, SCE without variance."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentmerge.cli import main
from agentmerge.engine.moe.moe_config import moe_config_from_dict
from agentmerge.errors import ConfigError
from agentmerge.io.guards.strict_json import strict_bool


def _moe(tmp_path: Path, **extra: object) -> dict[str, object]:
    experts = [{"path": str(tmp_path / f"a{i}"), "prompts": ["x y"]} for i in range(2)]
    return {"base": str(tmp_path / "base"), "experts": experts, **extra}


@pytest.mark.parametrize("value", ["false", "true", "no", 0, 1, [], "False"])
def test_moe_chat_template_must_be_a_real_boolean(tmp_path: Path, value: object) -> None:
    """``chat_template: 'false'`` (quoted) was read as true: the prompts went through the template silently."""
    with pytest.raises(ConfigError, match="chat_template must be true or false"):
        moe_config_from_dict(_moe(tmp_path, chat_template=value))


def test_moe_chat_template_booleans_and_default(tmp_path: Path) -> None:
    assert moe_config_from_dict(_moe(tmp_path, chat_template=False)).chat_template is False
    assert moe_config_from_dict(_moe(tmp_path, chat_template=True)).chat_template is True
    assert moe_config_from_dict(_moe(tmp_path)).chat_template is False


def test_moe_yaml_quoted_false_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "moe.yaml"
    text = json.dumps(_moe(tmp_path))[:-1] + ', "chat_template": "false"}'
    config.write_text(text)  # JSON is YAML
    assert main(["moe", str(config), "-o", str(tmp_path / "out"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "chat_template must be true or false (got 'false')" in err and "without quotes" in err


def test_strict_bool_reads_only_booleans() -> None:
    assert strict_bool(None, "x", default=True) is True and strict_bool(False, "x", default=True) is False
    with pytest.raises(ConfigError, match=r"^k must be true or false \(got 'yes'\)"):
        strict_bool("yes", "k", error=ConfigError)


@pytest.mark.parametrize("code", ["0", "None", "3", "'done'"])
def test_an_evaluator_that_exits_is_an_error_not_a_success(
    tiny_family: tuple[Path, list[Path]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    code: str,
) -> None:
    """``sys.exit(0)`` inside the evaluator ended ``converge`` with status 0, no table and no JSON."""
    base, agents = tiny_family
    (tmp_path / "quitter.py").write_text(f"import sys\n\ndef score(path):\n    sys.exit({code})\n")
    monkeypatch.chdir(tmp_path)
    argv = ["converge", str(base), str(agents[0]), "--evaluate", "python:quitter:score", "--metric", "m", "--quiet"]
    assert main([*argv, "--json", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.startswith("agentmerge: error")]
    assert len(lines) == 1 and "converge" in lines[0] and "sys.exit" in lines[0], err
    assert not (tmp_path / "c.json").exists()
