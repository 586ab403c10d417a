"""Fuzz every subcommand with generated bad inputs: each run ends with a status and at most a one-line error,
never a traceback. (``zoo build``/``zoo bench`` read no user files, only their own cache, and are left out.)

Inputs are drawn from a pool of broken model folders (safetensors, verl rank files, DCP metadata, LoRA
adapters), broken YAML and sweep files, task files, damaged ``results.jsonl`` and cache stores, odd numbers
and odd paths, mixed with one good family, so runs get past the first check too. Sweeps run with Ray
unavailable: every one stops at a check or at "needs Ray", before any trial.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import sys
from pathlib import Path

import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from agentmerge.cli import main

EXAMPLES = int(os.environ.get("AGENTMERGE_CLI_FUZZ_EXAMPLES", "120"))
SHAPES = {"embed.weight": (16, 8), "layers.0.mlp.weight": (8, 8), "layers.0.norm.weight": (8,)}


def _model(folder: Path, seed: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    save_file({n: torch.randn(s, generator=g).bfloat16() for n, s in SHAPES.items()}, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
    return folder


def _raw(folder: Path, header: bytes, data: bytes = b"", name: str = "model.safetensors") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(struct.pack("<Q", len(header)) + header + data)
    return folder


def _trainer_and_adapter_folders(root: Path) -> list[Path]:
    """Hostile trainer folders and adapters of issue 23 (tests.test_hostile_trainer / _adapters build them)."""
    from tests.hostile import model_folder
    from tests.test_hostile_adapters import adapter
    from tests.test_hostile_trainer import _overlap_and_gap, _set, dcp_folder, edit_metadata, verl_folder

    llama = model_folder(root / "lbase", 0)  # what the adapters were trained on
    out = [llama]
    dup = verl_folder(root / "verl_dup")
    shutil.copy(dup / "model_world_size_2_rank_1.pt", dup / "model_world_size_2_rank_01.pt")
    huge = root / "verl_huge" / "actor"
    huge.mkdir(parents=True)
    torch.save({"x": torch.ones(2)}, huge / "model_world_size_99999999999_rank_0.pt")
    out += [dup, huge, verl_folder(root / "verl_good")]
    out += [edit_metadata(dcp_folder(root / "dcp_gap"), _overlap_and_gap)]
    out += [edit_metadata(dcp_folder(root / "dcp_none"), _set("chunks", None))]
    out += [edit_metadata(dcp_folder(root / "dcp_dtype"), _set("dtype", "float32"))]
    for name, cfg in (("lora_zero", {"lora_alpha": 0}), ("lora_regex", {"rank_pattern": {"(": 2}}),
                      ("lora_big", {"lora_alpha": 1e9}), ("lora_r", {"r": 8}), ("lora_ok", {})):  # fmt: skip
        out.append(adapter(root / name, llama, **cfg))
    (root / "lora_nested").mkdir()
    shutil.copy(out[-1] / "adapter_model.safetensors", root / "lora_nested")
    (root / "lora_nested" / "adapter_config.json").write_text("[" * 50_000)
    return [*out, root / "lora_nested"]


def _task_and_sweep_files(root: Path, good: list[Path]) -> dict[str, list[str]]:
    """Task files and sweep files (each with a results.jsonl beside it in its --out folder)."""
    tasks = {
        "t_nested": "[" * 50_000,
        "t_regex": json.dumps({"prompt": "p", "reference": "(a|a)+$", "match": "regex"}),
        "t_bad": '{"prompt": 1}',
        "t_good": json.dumps({"prompt": "Say 7", "reference": "7", "max_new_tokens": 1}),
    }
    for name, text in tasks.items():
        (root / f"{name}.jsonl").write_text(text + "\n")
    sweeps = []
    models = [str(g) for g in good]
    grids: dict[str, dict[str, object]] = {
        "s_good": {"methods": {"ram": {}}, "evaluate": "python:m:f"},
        "s_tasks": {"methods": {"ram": {}}, "evaluate": f"tasks:{root / 't_bad.jsonl'}"},
        "s_huge": {"methods": {"ties": {k: list(range(1, 30)) for k in ("density", "lambda", "a", "b")}}, "evaluate": "zoo"},
        "s_named": {"trials": [{"name": "../x", "method": "ram"}], "evaluate": "zoo"},
    }  # fmt: skip
    for name, data in grids.items():
        (root / f"{name}.yaml").write_text(yaml.safe_dump({"base": models[0], "models": models[1:], **data}))
        sweeps.append(str(root / f"{name}.yaml"))
    return {"tasks": [str(root / f"{n}.jsonl") for n in tasks] + ["/dev/zero"], "sweeps": sweeps}


def _results_lines() -> list[str]:
    record = {"trial": "f" * 16, "method": "ram", "params": {}, "models": ["a"], "seed": 0, "status": "ok",
              "metrics": {"score": 1.0}}  # fmt: skip
    return [
        json.dumps({**record, "name": "../../x"}),
        json.dumps({**record, "metrics": {"score": "high"}}),
        "[" * 50_000,
        '{"trial": "torn',
        json.dumps(record),
    ]


def _damaged_cache(root: Path) -> Path:
    cache = root / "cache"
    (cache / "stats").mkdir(parents=True)
    (cache / "sha256.json").write_text("[" * 100_000)
    (cache / "xxh3_128.json").write_text(json.dumps({"x": {"value": "zz", "check": "0"}}))
    return cache


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    root = tmp_path_factory.mktemp("fuzzpool")
    good = [_model(root / f"good{i}", i) for i in range(3)]
    bad: list[Path] = []
    bad.append(_raw(root / "nested", b"[" * 50_000 + b"]" * 50_000))
    bad.append(
        _raw(root / "bigint", b'{"t": {"dtype": "F32", "shape": [' + b"9" * 5000 + b'], "data_offsets": [0, 4]}}')
    )
    bad.append(_raw(root / "dup", b'{"t": {"dtype":"F32","shape":[1],"data_offsets":[0,4]}, "t": 1}', b"\0" * 4))
    bad.append(_raw(root / "meta", b'{"__metadata__": {"a": [1]}}'))
    bad.append(_raw(root / "utf16", '{"a": 1}'.encode("utf-16")))
    bad.append(_raw(root / "short", b"{}", b"", name="model.safetensors"))
    (root / "trunc").mkdir()
    (root / "trunc" / "model.safetensors").write_bytes(b"\x07")
    bad.append(root / "trunc")
    (root / "dirweights" / "model.safetensors").mkdir(parents=True)
    bad.append(root / "dirweights")
    for name, text in (("cfglist", "[1]"), ("cfgnested", "[" * 50_000), ("cfgbad", "{")):
        m = _model(root / name, 7)
        (m / "config.json").write_text(text)
        bad.append(m)
    idx = _model(root / "idx", 8)
    (idx / "model.safetensors.index.json").write_text('{"weight_map": {"embed.weight": "../good0/model.safetensors"}}')
    bad.append(idx)
    (root / "empty").mkdir()
    bad.append(root / "empty")
    (root / "old.bin").mkdir()
    (root / "old.bin" / "pytorch_model.bin").write_bytes(b"\x80\x02garbage")
    bad.append(root / "old.bin")
    yamls: list[Path] = []
    texts: dict[str, str | bytes] = {
        "bomb": "a: &a [x,x,x,x,x,x,x,x,x,x]\n"
        + "".join(f"a{i}: &a{i} [{', '.join(['*a' if i == 1 else f'*a{i - 1}'] * 10)}]\n" for i in range(1, 8))
        + "merge_method: ties\nmodels: [{model: *a7}]\n",
        "utf16": "method: ram\n".encode("utf-16"),
        "latin1": b"method: r\xe4m\n",
        "bigint": "method: ram\nseed: " + "9" * 5000 + "\n",
        "inf": f"method: unique_only\nbase: {good[0]}\nmodels: [{good[1]}, {good[2]}]\nparams: {{agent: .inf}}\n",
        "hugeR": f"method: ram_plus\nbase: {good[0]}\nmodels: [{good[1]}, {good[2]}]\nparams: {{r: {'9' * 400}}}\n",
        "list": "[1, 2]\n",
        "mk": f"merge_method: breadcrumbs\nbase_model: {good[0]}\nmodels: [{{model: {good[1]}}}, {{model: {good[2]}}}]\n"
        "parameters: {density: 1.0}\n",
        "mkbad": "merge_method: della\nmodels: [{model: x, parameters: {density: [1, {a: 2}]}}]\n",
        "tags": "!!python/object/apply:os.system ['echo hi']\n",
        "nested": "method: ram\nmodels: " + "[" * 3000 + "]" * 3000 + "\n",
        "good": f"method: ram\nbase: {good[0]}\nmodels: [{good[1]}, {good[2]}]\n",
    }
    for name, text in texts.items():
        p = root / f"{name}.yaml"
        p.write_bytes(text if isinstance(text, bytes) else text.encode())
        yamls.append(p)
    bad += _trainer_and_adapter_folders(root)
    files = _task_and_sweep_files(root, good)
    return {
        **files,
        "results": _results_lines(),
        "cache": [str(_damaged_cache(root))],
        "models": [str(p) for p in good + bad]
        + [
            "mdoels/good0",
            "./nope",
            "someone/some-model",
            "",
            "org/" + "x" * 5000,
            f"{root / 'lbase'}+{root / 'lora_ok'}",
        ],
        "good": [str(p) for p in good],
        "yamls": [str(p) for p in yamls] + [str(root / "missing.yaml"), str(root)],
        "numbers": ["0", "-1", "1", "nan", "inf", "-inf", "1e309", "9" * 400, "abc", "0.5", "", "2", "1,abc"],
        "root": [str(root)],
    }


def _token(draw: st.DrawFn, pool: dict[str, list[str]], kind: str) -> str:
    return draw(st.sampled_from(pool[kind]))


@st.composite
def argvs(draw: st.DrawFn, pool: dict[str, list[str]]) -> list[str]:
    out = str(Path(pool["root"][0]) / "outs" / f"o{draw(st.integers(0, 3))}")
    command = draw(
        st.sampled_from(
            ["merge", "merge-yaml", "probe", "methods", "fisher", "convert", "lm-eval", "eval", "convert-weights",
             "eval-tasks", "sweep", "converge"]
        )
    )  # fmt: skip
    if command in ("convert-weights", "eval-tasks", "sweep", "converge"):
        return _new_commands(draw, pool, command, out)
    models = draw(st.lists(st.one_of(st.sampled_from(pool["good"]), st.sampled_from(pool["models"])), max_size=3))
    number = st.sampled_from(pool["numbers"])
    if command == "merge":
        method = draw(st.sampled_from(["ram", "ram_plus", "linear", "ties", "della", "unique_only", "nope", "fisher"]))
        argv = ["merge", "--method", method, "--base", _token(draw, pool, "models"), "-o", out, "--quiet"]
        argv += [x for m in models for x in ("--model", m)]
        for flag in draw(st.lists(st.sampled_from(["--weights", "--param", "--dtype", "--threads", "--chunk-size"]))):
            value = draw(number)
            if flag == "--param":
                value = f"{draw(st.sampled_from(['r', 'epsilon', 'agent', 'lambda', 'density', 'x']))}={value}"
            elif flag == "--dtype":
                value = draw(st.sampled_from(["bool", "int8", "F8_E4M3", "float16", "x", value]))
            argv += [flag, value] if flag not in ("--threads", "--chunk-size") or value.lstrip("-").isdigit() else []
        argv += draw(st.lists(st.sampled_from(["--dry-run", "--force", "--force-any", "--json"]), max_size=2))
        return argv
    if command == "merge-yaml":
        return ["merge", _token(draw, pool, "yamls"), out, "--quiet", *draw(st.lists(st.just("--dry-run"), max_size=1))]
    if command == "probe":
        argv = ["probe", "--base", _token(draw, pool, "models"), *(models or pool["good"][:1]), "--quiet"]
        for flag in draw(st.lists(st.sampled_from(["--epsilon", "--r", "--alpha"]), max_size=2)):
            value = draw(number)
            argv += [flag, value] if (value and value.replace(".", "").isdigit()) or value in ("nan", "inf") else []
        if draw(st.booleans()):
            argv += ["--json", draw(st.sampled_from([str(Path(out) / "x" / "r.json"), pool["good"][0], out + ".json"]))]
        return argv
    if command == "methods":
        return ["methods", *draw(st.lists(st.just("--json"), max_size=1))]
    if command == "fisher":
        argv = ["fisher", _token(draw, pool, "models"), "--out", out]
        if draw(st.booleans()):
            argv += [
                "--samples",
                draw(st.sampled_from(["0", "-3", "1"])),
                "--max-tokens",
                draw(st.sampled_from(["0", "1"])),
            ]
        return argv
    if command == "convert":
        to = draw(st.sampled_from([[], ["--to", "mergekit"], ["--to", "mergekit", "-o", out + ".yaml"]]))
        return ["convert-config", _token(draw, pool, "yamls"), *to]
    if command == "lm-eval":
        return ["lm-eval", _token(draw, pool, "models"), "--tasks", "nope"]
    return ["eval", _token(draw, pool, "models"), "--n", draw(st.sampled_from(["0", "-1", "1"]))]


def _new_commands(draw: st.DrawFn, pool: dict[str, list[str]], command: str, out: str) -> list[str]:
    """convert (weights), eval with a task file and counts, sweep with a damaged results.jsonl, converge."""
    number = st.sampled_from(["-3", "0", "1", "2"])
    if command == "convert-weights":
        return ["convert", _token(draw, pool, "models"), out, *draw(st.lists(st.just("--force"), max_size=1))]
    if command == "eval-tasks":
        argv = ["eval", _token(draw, pool, "models"), "--tasks", _token(draw, pool, "tasks"), "--quiet"]
        for flag in draw(st.lists(st.sampled_from(["--limit", "--samples", "--batch-size", "--max-new-tokens"]))):
            argv += [flag, draw(number)]
        return argv
    if command == "converge":
        spec = draw(st.sampled_from(["nope", "python:no_such_module:f", "tasks:" + _token(draw, pool, "tasks"), "zoo"]))
        argv = ["converge", _token(draw, pool, "models"), _token(draw, pool, "models"), "--evaluate", spec, "--quiet"]
        argv += ["--scales", draw(st.sampled_from(["1,1.5", "1,2", "0,1,1.5", "abc", "1,1.5,nan", "-1,1,1.5"]))]
        return argv + [
            x for m in draw(st.lists(st.sampled_from(["m", "x=m", "=", ""]), max_size=2)) for x in ("--metric", m)
        ]
    lines = draw(st.lists(st.sampled_from(pool["results"]), max_size=3))
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "results.jsonl").write_text("".join(line + "\n" for line in lines))
    return ["sweep", _token(draw, pool, "sweeps"), "--out", out, "--quiet"]


def test_every_subcommand_on_bad_input_gives_a_status_not_a_traceback(
    pool: dict[str, list[str]], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # sweeps stop before their first trial
    monkeypatch.setenv("AGENTMERGE_CACHE", pool["cache"][0])  # damaged stores: read as empty or recomputed

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(argvs(pool))
    def run(argv: list[str]) -> None:
        shutil.rmtree(Path(pool["root"][0]) / "outs", ignore_errors=True)
        try:
            status = main(argv)
        except SystemExit as e:  # argparse's usage errors: one usage line and status 2
            status = int(e.code or 0)
        err = capsys.readouterr().err
        assert status in (0, 1, 2), (argv, status, err)
        assert "Traceback" not in err, (argv, err)
        lines = [line for line in err.splitlines() if line.startswith("agentmerge: error")]
        assert len(lines) <= 1 and all(len(line) < 2000 for line in lines), (argv, err[:500])

    run()
