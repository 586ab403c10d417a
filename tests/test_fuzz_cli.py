"""Fuzz every subcommand with generated bad inputs: each run ends with a status and at most a one-line error,
never a traceback. (``zoo build``/``zoo bench`` read no user files, only their own cache, and are left out.)

Inputs are drawn from a pool of broken model folders, broken YAML files, odd numbers and odd paths, mixed
with one good family, so runs get past the first check too.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import pytest
import torch
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
    return {
        "models": [str(p) for p in good + bad] + ["mdoels/good0", "./nope", "someone/some-model", ""],
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
    command = draw(st.sampled_from(["merge", "merge-yaml", "probe", "methods", "fisher", "convert", "lm-eval", "eval"]))
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


def test_every_subcommand_on_bad_input_gives_a_status_not_a_traceback(
    pool: dict[str, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
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
