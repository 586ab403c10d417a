"""The evaluation cache shared by the zoo bench and the sweep's zoo evaluator: keys, reuse, whole files."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from agentmerge_zoo import evaluate as zoo_evaluate
from agentmerge_zoo.evaluate import EvalReport, evaluate_cached
from agentmerge_zoo.tasks import SUITE_VERSION, all_tasks


def _checkpoint(folder: Path, payload: bytes) -> Path:
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(payload)
    return folder


def _old_key(folder: Path, split: str, n: int, tasks: list[str]) -> str:
    """The key the bench used before its merges ran on the sweep engine (the reference, written out)."""
    digest = hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()[:16]
    parts = [digest, split, n, tasks, SUITE_VERSION]
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    calls: list[Path] = []

    def fake(checkpoint: Path, **kwargs: Any) -> EvalReport:
        calls.append(checkpoint)
        return EvalReport(
            str(checkpoint), kwargs["split"], {"code.exact": 0.25}, {"code.exact": 0.1}, {"code.exact": 4}
        )

    monkeypatch.setattr(zoo_evaluate, "evaluate", fake)
    return calls


def test_an_older_bench_cache_entry_is_found_under_any_label(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting(monkeypatch)
    ckpt = _checkpoint(tmp_path / "trials" / "code+tool.ram", b"weights")
    cache = tmp_path / "evals"
    cache.mkdir()
    key = _old_key(ckpt, "test", 24, ["code", "tool"])
    old = EvalReport("elsewhere/merges/ram", "test", {"code.exact": 0.5}, {"code.exact": 0.0}, {"code.exact": 24})
    (cache / f"ram.test.{key}.json").write_text(json.dumps(old.to_dict()))
    report, cached = evaluate_cached(ckpt, split="test", n=24, tasks=["code", "tool"], batch_size=8, cache=cache)
    assert cached and report.metrics == {"code.exact": 0.5} and calls == []
    # another split, size or task list is another key: evaluated, then found
    for split, n, tasks in (("val", 24, ["code", "tool"]), ("test", 16, ["code", "tool"]), ("test", 24, None)):
        first, hit = evaluate_cached(ckpt, split=split, n=n, tasks=tasks, batch_size=8, cache=cache, label="x")
        again, hit_again = evaluate_cached(ckpt, split=split, n=n, tasks=tasks, batch_size=8, cache=cache)
        assert not hit and hit_again and again.metrics == first.metrics
        names = tasks or list(all_tasks())
        assert (cache / f"x.{split}.{_old_key(ckpt, split, n, names)}.json").is_file()
    assert len(calls) == 3
    assert not list(cache.glob(".*"))  # no temporary file left behind


def test_other_weights_are_not_served_from_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting(monkeypatch)
    cache = tmp_path / "evals"
    a = _checkpoint(tmp_path / "a", b"weights a")
    b = _checkpoint(tmp_path / "b", b"weights b")
    evaluate_cached(a, split="test", n=8, tasks=["code"], batch_size=8, cache=cache)
    _, cached = evaluate_cached(b, split="test", n=8, tasks=["code"], batch_size=8, cache=cache)
    assert not cached and calls == [a, b]
    (cache / next(p.name for p in cache.iterdir() if p.name.startswith("b."))).write_text("{torn")
    _, cached = evaluate_cached(b, split="test", n=8, tasks=["code"], batch_size=8, cache=cache)
    assert not cached and len(calls) == 3  # an unreadable entry is evaluated again, not trusted


def test_converge_on_a_folder_without_a_tokenizer_is_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``converge --evaluate zoo`` reaches the evaluator without the eval command's checks (found by the fuzz test)."""
    from agentmerge.cli import main
    from agentmerge.errors import AgentMergeError
    from tinylm import constant_lm

    model = constant_lm(tmp_path / "lm", "a")
    for tokenizer_file in model.glob("tokenizer*"):
        tokenizer_file.unlink()
    with pytest.raises(AgentMergeError, match="lm: cannot load its tokenizer"):
        zoo_evaluate.evaluate(model, n=1, quiet=True)
    assert main(["converge", str(model), str(model), "--evaluate", "zoo", "--quiet", "--scales", "1,1.5"]) == 2
    err = capsys.readouterr().err
    assert "lm: cannot load its tokenizer" in err and "Traceback" not in err
