"""Diagonal Fisher information of a causal language model, the input of Fisher merging.

For samples x_1..x_n (token sequences, each with a prompt of ``s`` tokens whose likelihood is not scored):

    F[p] = (1/n) * sum_k ( d/d theta_p  sum_{t >= s} log p_theta(x_k[t] | x_k[<t]) )^2

With ``texts`` the x_k are given texts (the empirical Fisher of that data); without them they are the
model's own completions sampled from the BOS token (a Monte-Carlo estimate of the true Fisher). One
sequence per backward pass, on the CPU, in float32.

The result is written like a checkpoint (``model.safetensors``, or shards with an index) with the
model's tensor names, so the merge driver streams it chunk by chunk like weights: every floating
tensor of the checkpoint gets an entry (zeros where the model has no such parameter, which Fisher
merging turns into the plain weighted average through its floor). ``fisher.json`` records how it was made.

Cost: memory ~ 12 bytes per parameter (float32 weights, gradients and the running sum: ~6 GB for a
0.5B model, ~90 GB for 7B); time ~ n x (forward + backward) of one sequence, plus sampling.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from agentmerge.errors import AgentMergeError
from agentmerge.io.formats.checkpoint import Checkpoint
from agentmerge.io.formats.open import open_weights, trainer_config_folder
from agentmerge.io.formats.roles import FISHER_MARK, check_fisher_role
from agentmerge.io.formats.tensorfile import dtype_from_name
from agentmerge.io.guards import jsontext
from agentmerge.io.guards.units import parse_size
from agentmerge.io.output.atomic import atomic_output_dir
from agentmerge.io.output.shards import PlannedTensor, plan_shards
from agentmerge.io.output.writer import ShardWriter

T = TypeVar("T")


def transformers_step(path: str | Path, what: str, step: Callable[[], T]) -> T:
    """Run a transformers step; any failure of a bad model folder is one ``AgentMergeError`` line."""
    try:
        return step()
    except AgentMergeError:
        raise
    except Exception as e:  # transformers raises OSError, ValueError, KeyError, RuntimeError... for bad folders
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise AgentMergeError(f"{path}: cannot {what} ({type(e).__name__}: {first})") from None


@dataclass(frozen=True)
class Sample:
    """One scored sequence: token ids ``[T]``; tokens from ``prompt`` on are scored."""

    ids: torch.Tensor
    prompt: int = 1


def load_causal_lm(path: str | Path) -> Any:
    """A transformers causal LM in float32, eval mode, on the CPU; a trainer checkpoint (verl, DCP) is built
    from its config.json and given its weights (``open.open_weights``)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = trainer_config_folder(path)
    if folder is None:
        model: Any = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    else:
        config = AutoConfig.from_pretrained(str(folder))
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
        _load_trainer_weights(model, path)
    model.eval()
    return model


def _load_trainer_weights(model: Any, path: str | Path) -> None:
    """Every parameter from the trainer checkpoint (tied ones may be stored once); a tensor the model lacks,
    or one it needs and the checkpoint lacks, is an error naming it."""
    weights = open_weights(path)
    try:
        state = {n: weights.read(n).view(i.shape).float() for n, i in weights.tensors.items()}
    finally:
        weights.close()
    missing, unexpected = model.load_state_dict(state, strict=False)
    ties = getattr(model.config, "tie_word_embeddings", False)
    tied = set(getattr(model, "_tied_weights_keys", None) or []) if ties else set()
    missing = [m for m in missing if m not in tied]
    if missing or unexpected:
        what = f"lacks {missing[0]!r}" if missing else f"has {unexpected[0]!r}, which the model does not"
        raise AgentMergeError(f"{path}: the checkpoint {what}; it does not match its config.json")
    model.tie_weights()


def config_parameters(path: str | Path) -> int:
    """Parameters of the causal LM that ``path``'s config.json describes, counted on the meta device (no memory)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(trainer_config_folder(path) or path))
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    return int(sum(p.numel() for p in skeleton.parameters()))


def sequence_logprob(model: Any, sample: Sample) -> torch.Tensor:
    """Scalar: sum of log p(x[t] | x[<t]) over the scored tokens ``t >= prompt``."""
    ids = sample.ids[None, :]
    logits = model(input_ids=ids).logits[0, :-1].float()  # [T-1, V]: position t predicts token t+1
    logp = torch.log_softmax(logits, dim=-1).gather(1, sample.ids[1:, None])[:, 0]  # [T-1]
    return logp[max(0, sample.prompt - 1) :].sum()


@torch.no_grad()
def sample_completions(model: Any, n: int, max_tokens: int, seed: int, bos: int, eos: int | None) -> list[Sample]:
    """``n`` sequences ``[bos, y_1 .. y_m]`` sampled from the model (m <= max_tokens, stops at eos)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.tensor([bos])
        for _ in range(max_tokens):
            probs = torch.softmax(model(input_ids=ids[None, :]).logits[0, -1].float(), dim=-1)
            nxt = torch.multinomial(probs, 1, generator=gen)
            ids = torch.cat([ids, nxt])
            if eos is not None and int(nxt) == eos:
                break
        out.append(Sample(ids, 1))
    return out


def text_samples(tokenizer: Any, texts: Sequence[str], max_tokens: int) -> list[Sample]:
    """Tokenized texts (truncated to ``max_tokens``); every token after the first is scored."""
    out = []
    for text in texts:
        ids = tokenizer(text, truncation=True, max_length=max_tokens)["input_ids"]
        if len(ids) >= 2:
            out.append(Sample(torch.tensor(ids), 1))
    if not out:
        raise AgentMergeError("fisher: no text gives at least two tokens")
    return out


def diagonal_fisher(model: Any, samples: Iterable[Sample]) -> dict[str, torch.Tensor]:
    """Mean squared gradient of each sample's log-likelihood, per parameter name (tied names included)."""
    params = dict(model.named_parameters(remove_duplicate=False))
    unique = {id(p): p for p in params.values()}
    total = {key: torch.zeros_like(p, dtype=torch.float32) for key, p in unique.items()}
    n = 0
    for sample in samples:
        model.zero_grad(set_to_none=True)
        sequence_logprob(model, sample).backward()  # type: ignore[no-untyped-call]
        for key, p in unique.items():
            if p.grad is not None:
                total[key] += p.grad.float() ** 2
        n += 1
    if n == 0:
        raise AgentMergeError("fisher: no samples")
    return {name: total[id(p)] / n for name, p in params.items()}


def write_fisher(
    fisher: dict[str, torch.Tensor],
    model_path: str | Path,
    out: str | Path,
    *,
    dtype: str = "float32",
    max_shard_size: str | int = "5GB",
    meta: dict[str, Any] | None = None,
) -> Path:
    """Write one Fisher tensor per floating tensor of the checkpoint (its name and shape) into ``out``.

    Written like a merge: into a hidden sibling renamed into place when complete (a killed run leaves no
    valid-looking file), each file marked ``agentmerge: fisher`` in its metadata so a merge never takes
    it for model weights.
    """
    folder = Path(out)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise AgentMergeError(f"{folder}: already holds files; choose a new or empty folder for the Fisher")
    torch_dtype = dtype_from_name(dtype)
    weights = open_weights(model_path)
    infos = [i for i in weights.tensors.values() if i.dtype.is_floating_point]
    weights.close()
    planned = [PlannedTensor(i.name, torch_dtype, i.shape) for i in infos]
    with atomic_output_dir(folder) as tmp:
        mark = dict([FISHER_MARK])
        writer = ShardWriter(tmp, plan_shards(planned, parse_size(max_shard_size), mark), planned)
        missing = []
        try:
            for info in infos:
                value = fisher.get(info.name)
                if value is None:
                    missing.append(info.name)
                    value = torch.zeros(info.shape)
                elif tuple(value.shape) != tuple(info.shape):
                    raise AgentMergeError(
                        f"fisher: {info.name!r} has shape {list(value.shape)}, checkpoint {info.shape}"
                    )
                writer.write(info.name, 0, value.reshape(-1).to(torch_dtype))
        finally:
            writer.close()
        record = {**(meta or {}), "model": str(model_path), "dtype": dtype, "no_parameter": missing}
        (tmp / "fisher.json").write_text(jsontext.dumps(record, indent=2) + "\n")
    return folder


def check_causal_lm_folder(model_path: str | Path) -> None:
    """One-line errors, before transformers builds anything, for a folder that cannot be a causal LM: broken
    weights (agentmerge's own checks), a Fisher file, or a config.json that does not match the weights."""
    weights = open_weights(model_path)  # a broken folder fails here with agentmerge's own one-line errors
    try:
        if isinstance(weights, Checkpoint):
            check_fisher_role(weights, fisher=False)
        stored = sum(i.numel for i in weights.tensors.values() if i.dtype.is_floating_point)
    finally:
        weights.close()
    wanted = transformers_step(model_path, "read its config.json", lambda: config_parameters(model_path))
    if wanted > 1.5 * stored + 1024:  # e.g. a config.json without sizes: transformers would build a 7B default
        raise AgentMergeError(
            f"{model_path}: config.json describes a model of {wanted:,} parameters but the weights hold {stored:,}; "
            "the folder's config does not match its weights (fix config.json)"
        )


def estimate_fisher(
    model_path: str | Path,
    out: str | Path,
    *,
    texts: Sequence[str] | None = None,
    samples: int | None = None,
    max_tokens: int = 64,
    seed: int = 0,
    dtype: str = "float32",
    tokenizer: str | Path | None = None,
) -> Path:
    """Estimate the diagonal Fisher of ``model_path`` and write it to ``out`` (see the module docstring).

    ``tokenizer`` (a folder; default the model's) is used only with ``texts``.
    """
    if (samples is not None and samples < 1) or max_tokens < 1:
        raise AgentMergeError(f"fisher: samples ({samples}) and max_tokens ({max_tokens}) must be at least 1")
    check_causal_lm_folder(model_path)
    torch.manual_seed(seed)
    model = transformers_step(model_path, "load it as a transformers causal LM", lambda: load_causal_lm(model_path))
    if texts is not None:
        from transformers import AutoTokenizer

        chosen = list(texts)[:samples] if samples else list(texts)
        source = tokenizer or trainer_config_folder(model_path) or model_path
        tok = transformers_step(source, "load its tokenizer", lambda: AutoTokenizer.from_pretrained(str(source)))
        data = text_samples(tok, chosen, max_tokens)
        mode = "texts"
    else:
        cfg = model.config
        bos = cfg.bos_token_id if cfg.bos_token_id is not None else 0
        eos = cfg.eos_token_id if isinstance(cfg.eos_token_id, int) else None
        data = transformers_step(
            model_path, "sample from it", lambda: sample_completions(model, samples or 64, max_tokens, seed, bos, eos)
        )
        mode = "sampled"
    fisher = transformers_step(model_path, "compute its gradients", lambda: diagonal_fisher(model, data))
    meta = {"mode": mode, "samples": len(data), "max_tokens": max_tokens, "seed": seed}
    return write_fisher(fisher, model_path, out, dtype=dtype, meta=meta)
