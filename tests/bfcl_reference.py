"""BFCL's own checker, decoder and prompt builder, for the agreement test: ``bfcl-eval`` installed with
``pip install --no-deps --target`` into a temporary folder, the imports that would pull its API handlers,
tree-sitter parsers and retry library replaced by stubs, and the modules removed from ``sys.modules`` again."""

from __future__ import annotations

import subprocess
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

MODEL = "agentmerge-prompt-model"  # BFCL reads MODEL_CONFIG_MAPPING[model].underscore_to_dot only


def install(wheel: Path, target: Path) -> None:
    """``pip install --no-deps --target target wheel`` (the pinned wheel file, no index needed)."""
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(target)]
    subprocess.run([*cmd, str(wheel)], check=True, capture_output=True, timeout=300)


def _stub(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    return module


def _stubs() -> dict[str, types.ModuleType]:
    never = lambda *a, **k: None  # noqa: E731  (decorator factories BFCL's retry helper calls; never used here)
    config = types.SimpleNamespace(underscore_to_dot=False)
    return {
        "tenacity": _stub(
            "tenacity",
            retry=never,
            retry_if_exception_message=never,
            retry_if_exception_type=never,
            wait_random_exponential=never,
        ),
        "bfcl_eval.model_handler.parser.java_parser": _stub("java_parser", parse_java_function_call=never),
        "bfcl_eval.model_handler.parser.js_parser": _stub("js_parser", parse_javascript_function_call=never),
        "bfcl_eval.constants.model_config": _stub("model_config", MODEL_CONFIG_MAPPING={MODEL: config}),
    }


@contextmanager
def bfcl_modules(target: Path) -> Iterator[types.SimpleNamespace]:
    """BFCL's functions from the install in ``target``; ``sys.modules`` and ``sys.path`` are restored after."""
    before = set(sys.modules)
    sys.path.insert(0, str(target))
    sys.modules.update(_stubs())
    try:
        from bfcl_eval import utils
        from bfcl_eval.constants.enums import Language
        from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
        from bfcl_eval.model_handler import utils as handler_utils

        yield types.SimpleNamespace(
            ast_checker=ast_checker,
            python=Language.PYTHON,
            decode=handler_utils.default_decode_ast_prompting,
            system_prompt=handler_utils.formulate_system_prompt,
            default_format=utils.DEFAULT_SYSTEM_PROMPT_FORMAT,
            with_hint=utils._func_doc_language_specific_pre_processing,
            is_empty_output=utils.is_empty_output,
            is_call_format=utils.is_function_calling_format_output,
            chat=handler_utils.system_prompt_pre_processing_chat_model,
        )
    finally:
        sys.path.remove(str(target))
        for name in set(sys.modules) - before:
            del sys.modules[name]


def bfcl_verdict(bfcl: types.SimpleNamespace, output: str, entry: dict[str, Any], answer: Any, category: str) -> bool:
    """What BFCL's eval runner decides for one raw answer (``_evaluate_single_ast_entry`` and
    ``_evaluate_single_relevance_entry``, their glue written out)."""
    if "relevance" in category:
        try:
            decoded = bfcl.decode(output)
            has_call = not bfcl.is_empty_output(decoded)
        except Exception:
            has_call = False
        return not has_call if "irrelevance" in category else has_call
    try:
        decoded = bfcl.decode(output)
    except Exception:
        return False
    if not bfcl.is_call_format(decoded):
        return False
    result = bfcl.ast_checker(entry["function"], decoded, answer, bfcl.python, category, MODEL)
    return bool(result["valid"])
