"""Hostile LoRA adapters and added vocabulary rows (issue 23).

Each case failed before its fix: a broken model written with status 0 (``lora_alpha: 1e9``, ``lora_alpha:
0`` merged as a no-op, ``r`` that disagrees with lora_A's rank, huge ``modules_to_save`` tensors or added
rows), a hang (a ``rank_pattern`` key that backtracks catastrophically) or a traceback (a string alpha,
``r: 10**400``, zero or negative pattern ranks, a bad regex or a list as a pattern, deep nesting, a
100 k-character ``base_model_name_or_path``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from tests.hostile import bounded_merge, model_folder, one_line_error

from agentmerge import MergeConfig, ModelSpec, merge
from agentmerge.errors import AgentMergeError

PREFIX = "base_model.model."
Q = "model.layers.0.self_attn.q_proj"


def adapter(
    folder: Path, base: Path, rank: int = 4, scale: float = 0.05, extra: dict[str, Any] | None = None, **cfg: Any
) -> Path:
    """A LoRA adapter on q_proj written by hand as peft writes it (``extra``: more tensors, e.g. modules_to_save)."""
    folder.mkdir(parents=True)
    g = torch.Generator().manual_seed(7)
    tensors = {
        f"{PREFIX}{Q}.lora_A.weight": scale * torch.randn(rank, 8, generator=g),
        f"{PREFIX}{Q}.lora_B.weight": scale * torch.randn(8, rank, generator=g),
        **(extra or {}),
    }
    save_file(tensors, folder / "adapter_model.safetensors")
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 8, "target_modules": ["q_proj"], **cfg}
    config.setdefault("base_model_name_or_path", str(base))
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture
def base(tmp_path: Path) -> Path:
    return model_folder(tmp_path / "base", 0)


def merge_argv(base: Path, model: Path, out: Path) -> list[str]:
    return [
        "merge",
        "--method",
        "task_arithmetic",
        "--base",
        str(base),
        "--model",
        str(model),
        "-o",
        str(out),
        "--quiet",
    ]


@pytest.mark.parametrize(
    ("cfg", "words"),
    [
        ({"lora_alpha": 1e9}, ["lora_alpha", "scales"]),  # merged weights ~1e7 before
        ({"alpha_pattern": {"q_proj": 1e9}}, ["scales"]),
        ({"lora_alpha": 0}, ["lora_alpha is 0", "changes nothing"]),  # a silent no-op before
        ({"alpha_pattern": {"q_proj": 0}}, ["is 0"]),
        ({"r": 8}, ["rank 4", "r of module"]),  # peft refuses it; it was merged with s = alpha / 8
        ({"rank_pattern": {"q_proj": 2}}, ["rank 4"]),
        ({"lora_alpha": "16"}, ["lora_alpha must be a number"]),
        ({"lora_alpha": None}, ["lora_alpha must be a number"]),
        ({"lora_alpha": True}, ["lora_alpha must be a number"]),
        ({"r": 10**400}, ["r must be a positive integer"]),
        ({"r": -4}, ["r must be a positive integer"]),
        ({"r": 4.0}, ["r must be a positive integer"]),
        ({"rank_pattern": {"q_proj": 0}}, ["rank_pattern", "positive integer"]),
        ({"rank_pattern": {"q_proj": -2}}, ["rank_pattern", "positive integer"]),
        ({"rank_pattern": {"q_proj": [1, 2]}}, ["rank_pattern", "positive integer"]),
        ({"rank_pattern": {"q_proj": "4"}}, ["rank_pattern", "positive integer"]),
        ({"rank_pattern": [["q_proj", 4]]}, ["rank_pattern must map"]),
        ({"rank_pattern": {"q_proj(": 4}}, ["rank_pattern key", "not a valid regular expression"]),
        ({"alpha_pattern": {"[": 4}}, ["alpha_pattern key", "not a valid regular expression"]),
        ({"rank_pattern": {"x" * 5000: 4}}, ["5000 characters"]),
        ({"use_rslora": "yes"}, ["use_rslora must be true or false"]),
        ({"fan_in_fan_out": 1}, ["fan_in_fan_out must be true or false"]),
        ({"peft_type": ["LORA"]}, ["adapters are not supported"]),
        ({"base_model_name_or_path": "x" * 100_000}, None),  # no such folder: a name, merged as usual
    ],
)
def test_adapter_configs_are_checked_one_line_each(
    base: Path, tmp_path: Path, cfg: dict[str, Any], words: list[str] | None, capsys: pytest.CaptureFixture[str]
) -> None:
    a = adapter(tmp_path / "adapter", base, **cfg)
    out = tmp_path / "out"
    if words is None:
        assert merge_argv(base, a, out) and _status(merge_argv(base, a, out), capsys) == 0
        return
    one_line_error(merge_argv(base, a, out), capsys, "adapter_config.json", *words)
    assert not out.exists()


def _status(argv: list[str], capsys: pytest.CaptureFixture[str]) -> int:
    from tests.hostile import cli

    return cli(argv, capsys)[0]


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, '{"r": 4, "x": ' + "[" * 500 + "]" * 500 + "}", "{"])
def test_adapter_config_that_is_not_json_or_nested_too_deeply_is_one_line(
    base: Path, tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    a = adapter(tmp_path / "adapter", base)
    (a / "adapter_config.json").write_text(text)
    one_line_error(merge_argv(base, a, tmp_path / "out"), capsys, "adapter_config.json")


def test_a_rank_pattern_key_that_backtracks_catastrophically_is_stopped(base: Path, tmp_path: Path) -> None:
    a = adapter(tmp_path / "adapter", base, rank_pattern={"(.|.)*\\d\\d": 2})  # 2^31 ways to fail on q_proj's name
    out = bounded_merge(base, a, tmp_path / "out")
    assert "refused:" in out and "catastrophic backtracking" in out and "rank_pattern" in out, out


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_adapter_files_that_are_not_regular_files_are_refused(base: Path, tmp_path: Path, kind: str) -> None:
    import os

    a = adapter(tmp_path / "adapter", base)
    target = a / ("adapter_config.json" if kind == "fifo" else "adapter_model.safetensors")
    target.unlink()
    if kind == "fifo":
        os.mkfifo(target)
    else:
        (a / "adapter_model.safetensors").unlink(missing_ok=True)
        (a / "adapter_model.bin").symlink_to("/dev/zero")
    out = bounded_merge(base, a, tmp_path / "out")
    assert "refused:" in out and "not a regular file" in out, out


@pytest.mark.parametrize("value", [1e30, float("nan"), -2e6])
def test_modules_to_save_and_lora_updates_are_bounded_like_weights(
    base: Path, tmp_path: Path, value: float, capsys: pytest.CaptureFixture[str]
) -> None:
    head = torch.zeros(16, 8)
    head[3, 5] = value
    a = adapter(tmp_path / "adapter", base, extra={f"{PREFIX}lm_head.weight": head})  # modules_to_save
    one_line_error(merge_argv(base, a, tmp_path / "out"), capsys, "lm_head.weight", "element 29")
    b = adapter(tmp_path / "big", base, scale=3000.0)  # alpha 8, r 4: B A of ~1e7 * 2
    one_line_error(merge_argv(base, b, tmp_path / "out"), capsys, "q_proj", "beyond")
    assert not (tmp_path / "out").exists()


def test_added_vocabulary_rows_are_bounded_like_weights(
    base: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    agent = model_folder(tmp_path / "agent", 1)
    tensors = load_file(str(agent / "model.safetensors"))
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        rows = torch.zeros(2, 8, dtype=torch.bfloat16)
        rows[1, 2] = 3e7 if name == "lm_head.weight" else 0.5
        tensors[name] = torch.cat([tensors[name], rows])
    save_file(tensors, agent / "model.safetensors")
    for f in (base, agent):
        cfg = json.loads((f / "config.json").read_text())
        (f / "config.json").write_text(json.dumps({**cfg, "vocab_size": 16 if f == base else 18}))
    one_line_error(merge_argv(base, agent, tmp_path / "out"), capsys, "lm_head.weight", "added vocabulary rows")


def test_good_adapters_still_merge(base: Path, tmp_path: Path) -> None:
    a = adapter(tmp_path / "adapter", base, rank_pattern={"q_proj": 4}, alpha_pattern={"layers\\.0\\..*q_proj": -4})
    cfg = MergeConfig(method="task_arithmetic", base=str(base), models=[ModelSpec(path=str(a))])
    merge(cfg, tmp_path / "out", quiet=True)
    got = load_file(str(tmp_path / "out" / "model.safetensors"))[f"{Q}.weight"].float()
    w = load_file(str(a / "adapter_model.safetensors"))
    want = load_file(str(base / "model.safetensors"))[f"{Q}.weight"].float() + (-4 / 4) * (
        w[f"{PREFIX}{Q}.lora_B.weight"] @ w[f"{PREFIX}{Q}.lora_A.weight"]
    )
    assert torch.allclose(got, want, atol=1e-2)
    with pytest.raises(AgentMergeError):  # and a bad one still fails in Python too
        bad = adapter(tmp_path / "bad", base, lora_alpha=0)
        merge(MergeConfig(method="task_arithmetic", base=str(base), models=[ModelSpec(path=str(bad))]), tmp_path / "o2")
