"""BFCL's prompt mode: the default system prompt, the chat of one question, few-shot demonstrations.

The system prompt is the text BFCL builds by default (``ret_fmt=python``, no tool-call tag, function docs as
JSON, plain text, classic style): the instructions, then the question's function docs dumped as JSON (indent
4), each description ending with BFCL's " Note that the provided function is in Python 3 syntax." A question
that brings its own system message gets ours in front of it (two newlines between), as BFCL does.

Few-shot (not part of BFCL): K demonstration turns put between the system prompt and the question, each a
user turn holding the demonstration's own function docs and question, and an assistant turn holding its
accepted answer written as calls (``[f(a=1), g(b='x')]``; arguments that may be left out are).
"""

from __future__ import annotations

import copy
import random
from collections.abc import Mapping, Sequence
from typing import Any

from agentmerge.errors import ConfigError
from agentmerge.evaluation.bfcl.data import LIVE, Item
from agentmerge.io.guards import jsontext

PYTHON_HINT = " Note that the provided function is in Python 3 syntax."
_ANSWER_FORMAT = "[func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)]"
_INSTRUCTIONS = (
    "You are an expert in composing functions."
    "You are given a question and a set of possible functions. Based on the question, you will need to make one or "
    "more function/tool calls to achieve the purpose. If none of the functions can be used, point it out. If the "
    "given question lacks the parameters required by the function, also point it out.\n\n"
    "You should only return the function calls in your response.\n\n"
    f"If you decide to invoke any of the function(s), you MUST put it in the format of {_ANSWER_FORMAT}.  "
    "You SHOULD NOT include any other text in the response.\n\n"
    "At each turn, you should try your best to complete the tasks requested by the user within the current turn. "
    "Continue to output functions to call until you have fulfilled the user's request to the best of your "
    "ability. Once you have no more functions to call, the system will consider the current turn complete and "
    "proceed to the next turn or task.\n\n"
)
_FUNCTIONS_INTRO = "Here is a list of functions in json format that you can invoke.\n"
# which live category demonstrates which kind of question (first choice first)
_DEMO_SOURCES = {
    "simple": ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple"),
    "multiple": ("live_multiple", "live_simple", "live_parallel_multiple", "live_parallel"),
    "parallel": ("live_parallel", "live_parallel_multiple", "live_multiple", "live_simple"),
    "parallel_multiple": ("live_parallel_multiple", "live_parallel", "live_multiple", "live_simple"),
}


def hinted(functions: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The function docs as BFCL shows them to the model: each description ends with the Python hint."""
    out = copy.deepcopy([dict(f) for f in functions])
    for f in out:
        f["description"] = f["description"] + PYTHON_HINT
    return out


def function_docs(functions: Sequence[Mapping[str, Any]]) -> str:
    return _FUNCTIONS_INTRO + jsontext.dumps(hinted(functions), indent=4) + "\n"


def system_prompt(functions: Sequence[Mapping[str, Any]]) -> str:
    """BFCL's default prompt-mode system prompt for these function docs."""
    return _INSTRUCTIONS + function_docs(functions)


def render_call(answer: Sequence[Mapping[str, Mapping[str, Sequence[Any]]]]) -> str:
    """An accepted answer as the model should write it: each call with its first accepted value per argument,
    leaving out the arguments that may be left out."""
    calls = []
    for expected in answer:
        name, accepted = next(iter(expected.items()))
        args = [f"{k}={values[0]!r}" for k, values in accepted.items() if values and "" not in values]
        calls.append(f"{name}({', '.join(args)})")
    return "[" + ", ".join(calls) + "]"


def chat(item: Item, demos: Sequence[Item] = ()) -> list[dict[str, str]]:
    """The messages of ``item`` in BFCL's prompt mode, with ``demos`` as demonstration turns."""
    messages = [dict(m) for m in item.messages]
    prompt = system_prompt(item.functions)
    turns: list[dict[str, str]] = []
    for demo in demos:
        question = function_docs(demo.functions) + "\n" + demo.messages[-1]["content"]
        turns += [
            {"role": "user", "content": question},
            {"role": "assistant", "content": render_call(demo.answer or ())},
        ]
    if messages and messages[0]["role"] == "system":
        messages[0]["content"] = prompt + "\n\n" + messages[0]["content"]
        return [messages[0], *turns, *messages[1:]]
    return [{"role": "system", "content": prompt}, *turns, *messages]


def demo_source(kind: str, scored: Sequence[str]) -> str:
    """The live category that demonstrates ``kind`` of question: the first of its choices not being scored."""
    for category in _DEMO_SOURCES.get(kind, _DEMO_SOURCES["simple"]):
        if category not in scored:
            return category
    raise ConfigError(
        "--few-shot: demonstrations come only from live AST categories that are not being scored (never from "
        f"the non-live test), and all of {', '.join(c for c in LIVE if 'relevance' not in c)} are; "
        "score fewer live categories"
    )


def demonstrations(pool: Sequence[Item], k: int, seed: int = 0) -> list[Item]:
    """``k`` demonstrations drawn (seeded) from ``pool``'s single-question items with an answer."""
    usable = [it for it in pool if it.answer and len(it.messages) == 1 and it.messages[0]["role"] == "user"]
    if len(usable) < k:
        raise ConfigError(f"--few-shot {k}: only {len(usable)} demonstrations to draw from")
    return random.Random(f"bfcl-few-shot:{seed}:{k}").sample(usable, k)
