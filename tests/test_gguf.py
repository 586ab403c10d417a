"""GGUF in and out: every tensor against transformers' own GGUF loader, merges of GGUF inputs, bad files.

Tiny llama / qwen2 / qwen3 models (``ggufmodels``) are written as GGUF by ``export_gguf`` and read back by
``GgufCheckpoint`` and by transformers (``from_pretrained(..., gguf_file=...)``); the values must agree
exactly, and differ from the source by no more than each type's rounding.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
import transformers

from agentmerge.cli import main
from agentmerge.engine.quantnote import QuantError, measure, note, step_of
from agentmerge.errors import AgentMergeError, CheckpointError, ConfigError
from agentmerge.io.formats.checkpoint import Checkpoint
from agentmerge.io.formats.gguf_names import permute_rows, unpermute_rows
from agentmerge.io.formats.gguf_read import GgufCheckpoint
from agentmerge.io.formats.open import open_weights
from agentmerge.io.output.gguf_write import export_gguf, export_with
from ggufmodels import CHAT, nudged, tiny_model

TEXT = "the model and the merge: token<|im_end|> Ünïcode 123"


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gguf-src")
    return {arch: tiny_model(root / arch, arch, tie=arch == "qwen2") for arch in ("llama", "qwen2", "qwen3")}


def export(src: Path, out: Path, qtype: str) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    export_with(open_weights, str(src), out, qtype)
    return out


def tf_gguf(path: Path) -> Any:
    return transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)


def rounded(values: torch.Tensor, qtype: str) -> torch.Tensor:
    """What ``qtype`` makes of ``values`` by its reference (round-to-nearest) rule, when there is one."""
    if qtype == "F32" or values.dim() < 2:
        return values
    if qtype in ("F16", "BF16"):
        return values.to(torch.float16 if qtype == "F16" else torch.bfloat16).float()
    q = gguf.quants.quantize(values.numpy(), gguf.GGMLQuantizationType.Q8_0)
    return torch.from_numpy(gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0))


CASES = [("llama", t) for t in ("F32", "F16", "BF16", "Q8_0", "Q6_K")]
CASES += [("qwen2", "F16"), ("qwen2", "Q8_0"), ("qwen3", "BF16"), ("qwen3", "Q6_K")]


@pytest.mark.parametrize(("arch", "qtype"), CASES)
def test_every_tensor_matches_transformers(sources: dict[str, Path], tmp_path: Path, arch: str, qtype: str) -> None:
    src = sources[arch]
    path = export(src, tmp_path / "m.gguf", qtype)
    theirs = tf_gguf(path).state_dict()
    with Checkpoint(src) as original, GgufCheckpoint(path) as ours:
        assert set(ours.tensors) == set(original.tensors)  # named as the HF checkpoint names them, none dropped
        for name, info in ours.tensors.items():
            mine = ours.read(name).float().reshape(info.shape)
            torch.testing.assert_close(mine, theirs[name], rtol=0, atol=0, msg=name)
            source = original.read(name).float().reshape(info.shape)
            if qtype == "Q6_K" and mine.dim() == 2:  # within a step (max|x| / 31, plus scale rounding) of each group
                groups = source.reshape(-1, 16)
                step = groups.abs().amax(dim=1, keepdim=True) / 31 + 1e-8
                assert bool(((mine.reshape(-1, 16) - groups).abs() <= step).all()), name
            else:
                torch.testing.assert_close(mine, rounded(source, qtype), rtol=0, atol=0, msg=name)
        # element ranges that start and stop inside rows (and inside q/k heads) read what a whole read reads
        name = next(n for n in ours.tensors if "k_proj" in n)
        whole = ours.read(name)
        assert torch.equal(ours.read(name, 77, 5000), whole[77:5000])


def test_tokenizer_and_chat_template_round_trip(sources: dict[str, Path], tmp_path: Path) -> None:
    path = export(sources["llama"], tmp_path / "m.gguf", "F16")
    src_tok = transformers.AutoTokenizer.from_pretrained(sources["llama"])
    tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    assert tok(TEXT)["input_ids"] == src_tok(TEXT)["input_ids"]
    assert tok.chat_template == CHAT
    assert (tok.eos_token_id, tok.bos_token_id) == (src_tok.eos_token_id, src_tok.bos_token_id)
    with GgufCheckpoint(path) as g:  # and the side folder agentmerge recovers holds the same
        side = transformers.AutoTokenizer.from_pretrained(g.folder)
        assert side(TEXT)["input_ids"] == src_tok(TEXT)["input_ids"]
        assert side.chat_template == CHAT


def test_permutation_is_llama_cpps_row_order() -> None:
    """HF row h·d + j·d/2 + i is GGUF row h·d + 2i + j (a naive loop), and unpermute undoes it."""
    heads, d, cols = 3, 8, 5
    hf = np.arange(heads * d * cols, dtype=np.float32).reshape(heads * d, cols)
    want = np.empty_like(hf)
    for h in range(heads):
        for j in range(2):
            for i in range(d // 2):
                want[h * d + 2 * i + j] = hf[h * d + j * d // 2 + i]
    assert np.array_equal(permute_rows(hf, heads), want)
    assert np.array_equal(unpermute_rows(want, heads), hf)


@pytest.fixture(scope="module")
def quantized_family(sources: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A llama base and two agents (safetensors) and the same three as Q8_0 GGUF files."""
    root = tmp_path_factory.mktemp("gguf-family")
    out = {"base": sources["llama"]}
    out |= {f"a{i}": nudged(sources["llama"], root / f"a{i}", seed=i) for i in (1, 2)}
    for key in ("base", "a1", "a2"):
        out[f"{key}.gguf"] = export(out[key], root / f"{key}-gguf" / f"{key}.gguf", "Q8_0")
    return out


def test_merge_of_gguf_inputs_writes_gguf(
    quantized_family: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A merge of GGUF inputs equals the merge of their dequantized safetensors copies; its GGUF output loads in
    transformers with the merged folder's logits within Q8_0's rounding; the summary notes the rounding."""
    f = quantized_family
    argv = ["--method", "task_arithmetic", "--base", str(f["base.gguf"]), "--model", str(f["a1.gguf"])]
    assert main(["merge", str(tmp_path / "m"), *argv, "--model", str(f["a2.gguf"]), "--gguf", "Q8_0"]) == 0
    assert "note: task vectors include quantization error" in capsys.readouterr().err
    notes = json.loads((tmp_path / "m" / "merge.json").read_text())["notes"]
    assert notes[0].startswith("task vectors include quantization error: base (Q8_0), ")
    copies = []
    for key in ("base", "a1", "a2"):
        assert main(["convert", str(f[f"{key}.gguf"]), str(tmp_path / f"{key}-st")]) == 0
        copies.append(str(tmp_path / f"{key}-st"))
    plain = ["--method", "task_arithmetic", "--base", copies[0], "--model", copies[1], "--model", copies[2]]
    assert main(["merge", str(tmp_path / "ref"), *plain, "--quiet"]) == 0
    with Checkpoint(tmp_path / "m") as merged, Checkpoint(tmp_path / "ref") as ref:
        for name in ref.tensors:
            assert torch.equal(merged.read(name), ref.read(name)), name
    ids = torch.tensor([[3, 40, 90, 200, 7, 64]])
    with torch.no_grad():
        want = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "m")(ids).logits
        got = tf_gguf(tmp_path / "m" / "model-Q8_0.gguf")(ids).logits
    assert float((got - want).abs().max()) < 0.05 * float(want.abs().max())  # Q8_0 rounding of the merge
    assert main(["merge", str(tmp_path / "m"), *argv, "--model", str(f["a2.gguf"]), "--quiet", "--force"]) == 0


def test_probe_notes_quantization(quantized_family: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    f = quantized_family
    assert main(["probe", str(f["a1.gguf"]), str(f["a2.gguf"]), "--base", str(f["base.gguf"]), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "note: task vectors include quantization error: base (Q8_0), " in out


def test_step_and_note_known_answers(quantized_family: dict[str, Path]) -> None:
    block = torch.linspace(-1.27, 1.27, 32)  # Q8_0: a range of 2.54 over 254 steps
    assert step_of(block, "Q8_0") == pytest.approx(2.54 / 254)
    assert step_of(torch.tensor([1.0, 1.5, -3.0]), "F16") == pytest.approx((2**-10 + 2**-10 + 2**-9) / 3)
    assert step_of(block, "F32") == 0.0
    q = QuantError({"base": ["Q4_K"]}, step=0.01, tau={"a": 0.02}, elements=100)
    assert "mean rounding step 0.01 " in note(q) and "a 0.02" in note(q) and "= 0.5)" in note(q)
    f = quantized_family
    with Checkpoint(f["base"]) as b, Checkpoint(f["a1"]) as a:
        assert measure(b, [a], ["a1"]) is None  # no quantized input: no note
    with GgufCheckpoint(f["base.gguf"]) as b, GgufCheckpoint(f["a1.gguf"]) as a, Checkpoint(f["a1"]) as exact:
        measured = measure(b, [a], ["a1"])
        assert measured is not None and measured.quantized == {"base": ["Q8_0"], "a1": ["Q8_0"]}
        # the agents were moved by N(0, 0.01²): mean |τ| ≈ 0.01·√(2/π) plus rounding
        assert 0.006 < measured.tau["a1"] < 0.012
        assert 0.0 < measured.step < 0.005
        assert measure(b, [exact], ["a1"]).quantized == {"base": ["Q8_0"]}  # type: ignore[union-attr]


# ---------------------------------------------------------------------------------------------- bad input


def _one_line(e: pytest.ExceptionInfo[AgentMergeError]) -> str:
    text = str(e.value)
    assert "\n" not in text
    return text


def test_truncated_and_corrupt_files(sources: dict[str, Path], tmp_path: Path) -> None:
    good = export(sources["llama"], tmp_path / "good" / "m.gguf", "Q8_0").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good[: len(good) // 2])
    with pytest.raises(CheckpointError) as e:
        open_weights(cut)
    assert "truncated or corrupt" in _one_line(e)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUX" + good[4:])
    with pytest.raises(CheckpointError) as e:
        open_weights(bad)
    assert "not a readable GGUF file" in _one_line(e)


def test_unknown_quantization_type(sources: dict[str, Path], tmp_path: Path) -> None:
    data = bytearray(export(sources["llama"], tmp_path / "g" / "m.gguf", "Q8_0").read_bytes())
    name = b"token_embd.weight"
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    dims = struct.unpack_from("<I", data, at)[0]
    struct.pack_into("<I", data, at + 4 + 8 * dims, 250)  # the tensor's type id
    odd = tmp_path / "odd.gguf"
    odd.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as e:
        open_weights(odd)
    assert "quantization type" in _one_line(e)


def cli_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one line ``agentmerge argv`` fails with."""
    assert main(argv) != 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("agentmerge: error: "), lines
    return lines[0]


def test_gguf_of_another_architecture_than_the_base(
    sources: dict[str, Path], quantized_family: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = export(sources["qwen3"], tmp_path / "q" / "q.gguf", "F16")
    out = tmp_path / "m"
    argv = ["merge", str(out), "--method", "task_arithmetic", "--base", str(quantized_family["base.gguf"])]
    line = cli_error([*argv, "--model", str(other), "--model", str(quantized_family["a1.gguf"]), "--quiet"], capsys)
    assert "('Qwen3ForCausalLM',) differs from" in line
    assert not out.exists() and not list(tmp_path.glob(".m.*"))


def test_output_types_not_written_and_atomic_export(
    sources: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "x.gguf"
    line = cli_error(["export-gguf", str(sources["llama"]), "-o", str(out), "--type", "Q3_K"], capsys)
    assert "--type: GGUF type 'Q3_K' is not written; use one of F32, F16" in line
    merge = ["merge", str(tmp_path / "m"), "--method", "linear", "--model", str(sources["llama"]), "--gguf", "IQ2_XS"]
    assert "--gguf: GGUF type 'IQ2_XS' is not written" in cli_error(merge, capsys)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ConfigError):
        export_with(open_weights, str(sources["llama"]), tmp_path / "x.bin", "F16")  # not a .gguf name

    def boom(*args: Any) -> Any:
        raise RuntimeError("disk went away")

    monkeypatch.setattr("agentmerge.io.output.gguf_write._encode", boom)
    with pytest.raises(RuntimeError), Checkpoint(sources["llama"]) as model:
        export_gguf(model, out, "F16")
    assert list(tmp_path.iterdir()) == []  # nothing written, no temporary file left


def test_folder_with_two_gguf_files(sources: dict[str, Path], tmp_path: Path) -> None:
    export(sources["llama"], tmp_path / "two" / "a.gguf", "F16")
    export(sources["llama"], tmp_path / "two" / "b.gguf", "F16")
    with pytest.raises(CheckpointError) as e:
        open_weights(tmp_path / "two")
    assert "holds 2 .gguf files" in _one_line(e)
    with GgufCheckpoint(tmp_path / "two" / "a.gguf") as one:  # a folder holding one is that file
        assert one.path.name == "a.gguf"


def test_eval_loads_a_gguf_as_its_source(sources: dict[str, Path], tmp_path: Path) -> None:
    """``eval``'s loader takes a GGUF file (transformers dequantizes it): at F32 it completes as the source does."""
    from agentmerge.evaluation.generation import Generator
    from agentmerge.evaluation.taskfile import Example

    path = export(sources["llama"], tmp_path / "m.gguf", "F32")
    ex = [Example(task="t", prompt="the model", reference="x", max_new_tokens=6)]
    mine = Generator.load(str(path), "cpu", "float32", True)
    theirs = Generator.load(str(sources["llama"]), "cpu", "float32", True)
    assert mine.text(ex[0]) == theirs.text(ex[0])  # the chat template came through
    assert mine.complete(ex, 1, "t", True) == theirs.complete(ex, 1, "t", True)


def test_a_range_read_dequantizes_only_its_rows(
    sources: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Memory stays bounded by the chunk: a range read decodes the rows holding it (whole heads for llama q/k)."""
    path = export(sources["llama"], tmp_path / "m.gguf", "Q8_0")
    seen: list[int] = []
    real = gguf.quants.dequantize

    def spy(data: np.ndarray, qtype: Any) -> np.ndarray:
        seen.append(data.shape[0])
        return real(data, qtype)

    with GgufCheckpoint(path) as g:
        monkeypatch.setattr(gguf.quants, "dequantize", spy)
        g.read("model.embed_tokens.weight", 256 * 10 + 5, 256 * 13)  # rows 10..12 of the embedding
        g.read("model.layers.0.self_attn.q_proj.weight", 256 * 70, 256 * 71)  # row 70: head 1 of 4 (64 rows each)
    assert seen == [3, 64]


def test_extract_lora_takes_gguf_inputs(quantized_family: dict[str, Path], tmp_path: Path) -> None:
    """extract-lora reads GGUF files as it reads folders: the adapter of a1 against the base is their task vector
    at rank 4 (the agents' update is full-rank noise, so only the shapes and that it is non-zero are checked)."""
    f = quantized_family
    out = tmp_path / "lora"
    argv = ["extract-lora", str(f["a1.gguf"]), "--base", str(f["base.gguf"]), "-o", str(out), "--rank", "4"]
    assert main([*argv, "--quiet"]) == 0
    with Checkpoint(out / "adapter_model.safetensors") as adapter:
        a = next(n for n in adapter.tensors if n.endswith("q_proj.lora_A.weight"))
        assert adapter.tensors[a].shape == (4, 256) and float(adapter.read(a).abs().sum()) > 0
