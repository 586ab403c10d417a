"""BFCL v4 single-turn AST evaluation (see data, prompt, decode, checker, evaluator)."""
