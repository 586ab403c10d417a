"""The lm-evaluation-harness adapter, on a merged tiny model and a tiny local task (no network)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentmerge import MergeConfig, ModelSpec, merge
from agentmerge.cli import main
from agentmerge.errors import AgentMergeError, ConfigError
from agentmerge.evaluation.lmeval import lm_eval_available, model_args, results_table, run_lm_eval

needs_lm_eval = pytest.mark.skipif(not lm_eval_available(), reason="lm-eval not installed (optional extra 'eval')")

LETTERS = "abcdefghijklmnopqrstuvwxyz"


def add_tokenizer(folder: Path) -> None:
    """A byte-level BPE over lowercase letters and spaces (54 tokens, within the tiny model's 96 rows)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<|endoftext|>": 0, "\u0120": 1, **{c: i + 2 for i, c in enumerate(LETTERS)}}
    vocab |= {"\u0120" + c: i + 28 for i, c in enumerate(LETTERS)}
    merges = [("\u0120", c) for c in LETTERS]
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.save_pretrained(folder)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))


def write_task(root: Path) -> Path:
    """A 6-question multiple-choice task on local jsonl data."""
    tasks = root / "tasks"
    tasks.mkdir()
    rows = [{"question": f"{LETTERS[i]}b c{LETTERS[i]}", "choices": ["ab", "zy"], "answer": i % 2} for i in range(6)]
    data = root / "tiny.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tasks / "tiny_local.yaml").write_text(
        "task: tiny_local\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        'doc_to_text: "{{question}}"\n'
        'doc_to_choice: "{{choices}}"\n'
        'doc_to_target: "{{answer}}"\n'
        "metric_list:\n  - metric: acc\n"
    )
    return tasks


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(var, "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf" / "datasets"))
    monkeypatch.setenv("AGENTMERGE_CACHE", str(tmp_path / "cache"))


@needs_lm_eval
def test_merged_model_on_a_local_task(
    tiny_family: tuple[Path, list[Path]], tmp_path: Path, offline: None, capsys: pytest.CaptureFixture[str]
) -> None:
    base, agents = tiny_family
    tokenized_base = tmp_path / "base"
    tokenized_base.mkdir()
    add_tokenizer(tokenized_base)
    cfg = MergeConfig(
        method="ram",
        base=str(base),
        models=[ModelSpec(path=str(a)) for a in agents],
        tokenizer_source=str(tokenized_base),
    )
    merge(cfg, tmp_path / "merged", quiet=True)
    tasks = write_task(tmp_path)
    out_json = tmp_path / "r.json"
    args = ["lm-eval", str(tmp_path / "merged"), "--tasks", "tiny_local", "--limit", "4"]
    assert main([*args, "--include-path", str(tasks), "--json", str(out_json)]) == 0
    assert "| tiny_local | acc,none |" in capsys.readouterr().out
    results = json.loads(out_json.read_text())
    assert 0.0 <= results["results"]["tiny_local"]["acc,none"] <= 1.0
    assert results_table(results).count("tiny_local") == 1


class _FakeTasks:
    """Stands in for lm-eval's task index (building the real one takes seconds)."""

    def __init__(self, include_path: str | None = None, include_defaults: bool = True) -> None:
        self.all_tasks = ["hellaswag", "arc_easy"] if include_defaults else []


@needs_lm_eval
def test_unknown_task_is_refused_before_loading(
    tiny_family: tuple[Path, list[Path]], offline: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import lm_eval.tasks

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", _FakeTasks)
    with pytest.raises(ConfigError, match=r"unknown lm-eval task 'hellaswagg'.*did you mean 'hellaswag'"):
        run_lm_eval(tiny_family[0], ["hellaswagg"], include_path="somewhere")


def test_not_a_model_folder(tmp_path: Path) -> None:
    with pytest.raises(AgentMergeError):
        run_lm_eval(tmp_path, ["hellaswag"])


def test_remote_code_is_off() -> None:
    assert model_args(Path("m"))["trust_remote_code"] is False


@pytest.fixture
def fake_lm_eval(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, object]]:
    """lm-eval's entry point replaced: records each simple_evaluate call and answers with two samples."""
    import sys
    import types

    from agentmerge.evaluation import lmeval

    calls: list[dict[str, object]] = []

    def simple_evaluate(**kwargs: object) -> dict[str, object]:
        calls.append(kwargs)
        samples = [{"doc_id": i, "arguments": ["<user>q</user>"], "resps": [["a"]], "exact_match": i} for i in (0, 1)]
        return {
            "results": {"mine": {"exact_match,none": 0.5}},
            "samples": {"mine": samples} if kwargs["log_samples"] else {},
        }

    fake = types.ModuleType("lm_eval")
    fake.simple_evaluate = simple_evaluate  # type: ignore[attr-defined]
    tasks = types.ModuleType("lm_eval.tasks")
    tasks.TaskManager = lambda include_path=None, include_defaults=True: types.SimpleNamespace(all_tasks=["mine"])  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "lm_eval", fake)
    monkeypatch.setitem(sys.modules, "lm_eval.tasks", tasks)
    monkeypatch.setattr(lmeval, "lm_eval_available", lambda: True)
    return calls


def test_chat_template_system_samples_and_generation_reach_lm_eval(
    tmp_path: Path, fake_lm_eval: list[dict[str, object]], capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = tmp_path / "m"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    (ckpt / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    argv = ["lm-eval", str(ckpt), "--tasks", "mine", "--chat-template", "--system", "Answer briefly."]
    argv += ["--gen-kwargs", "max_gen_toks=32,temperature=0", "--log-samples", str(tmp_path / "s")]
    assert main(argv) == 0
    call = fake_lm_eval[-1]
    assert call["apply_chat_template"] is True and call["system_instruction"] == "Answer briefly."
    assert call["gen_kwargs"] == "max_gen_toks=32,temperature=0" and call["log_samples"] is True
    assert call["model"] == "hf"
    out = capsys.readouterr()
    samples = tmp_path / "s" / "samples_mine.jsonl"
    assert f"samples: {samples}" in out.out and "| mine | exact_match,none | 0.5000 |" in out.out
    assert [json.loads(line)["doc_id"] for line in samples.read_text().splitlines()] == [0, 1]
    assert "chat template, not used" not in out.err
    assert main(["lm-eval", str(ckpt), "--tasks", "mine"]) == 0  # without it: a note that the template is unused
    assert fake_lm_eval[-1]["apply_chat_template"] is False and "chat template, not used" in capsys.readouterr().err


def test_bad_generation_settings_and_missing_vllm(
    tmp_path: Path, fake_lm_eval: list[dict[str, object]], capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    ckpt = tmp_path / "m"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    assert main(["lm-eval", str(ckpt), "--tasks", "mine", "--gen-kwargs", "256"]) == 2
    assert "write KEY=VALUE pairs" in capsys.readouterr().err
    if importlib.util.find_spec("vllm") is None:
        assert main(["lm-eval", str(ckpt), "--tasks", "mine", "--backend", "vllm"]) == 2
        assert "pip install vllm" in capsys.readouterr().err
    assert fake_lm_eval == []


def test_without_lm_eval_the_hint_says_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from agentmerge.evaluation import lmeval

    monkeypatch.setattr(lmeval, "lm_eval_available", lambda: False)
    assert main(["lm-eval", str(tmp_path), "--tasks", "x"]) == 2
    assert "pip install 'agentmerge[eval]'" in capsys.readouterr().err
