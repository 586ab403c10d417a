"""Regular expressions that come from users' files, run with a time limit per match.

A pattern such as ``(a+)+$`` takes time exponential in the length of the text it fails on (catastrophic
backtracking); Python's ``re`` cannot be interrupted. Patterns from files (an adapter's ``rank_pattern`` /
``alpha_pattern`` keys, an ``eval`` task's ``regex`` reference) are compiled and matched by the ``regex``
package (same syntax as ``re`` for these uses), which stops a match after ``MATCH_SECONDS`` and raises;
the caller turns that into one line naming the file and the pattern. Patterns longer than ``MAX_PATTERN``
characters are refused before compiling.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentmerge.errors import AgentMergeError, ConfigError

MATCH_SECONDS = 1.0  # per match: far more than any sane pattern needs on a module name or a model output
MAX_PATTERN = 4096


def _engine(error: type[AgentMergeError]) -> Any:
    try:
        import regex
    except ImportError:  # pragma: no cover - a dependency of agentmerge
        raise error("patterns from files need the 'regex' package: pip install regex") from None
    return regex


@dataclass(frozen=True)
class UserPattern:
    """A compiled user pattern; ``search`` / ``fullmatch`` stop after ``MATCH_SECONDS`` with ``error``."""

    text: str
    compiled: Any
    error: type[AgentMergeError] = field(default=ConfigError)

    @classmethod
    def compile(cls, text: object, where: str, error: type[AgentMergeError] = ConfigError) -> UserPattern:
        """``text`` compiled, or one line of ``error`` naming ``where``: not a string, too long, invalid."""
        if not isinstance(text, str):
            raise error(f"{where}: a pattern must be a string (got {type(text).__name__})")
        if len(text) > MAX_PATTERN:
            raise error(f"{where}: a pattern of {len(text)} characters (at most {MAX_PATTERN})")
        engine = _engine(error)
        try:
            return cls(text, engine.compile(text), error)
        except (engine.error, ValueError, OverflowError, RecursionError) as e:
            raise error(f"{where}: {text[:80]!r} is not a valid regular expression ({e})") from None

    def _run(self, how: str, value: str, where: str) -> bool:
        try:
            return getattr(self.compiled, how)(value, timeout=MATCH_SECONDS) is not None
        except TimeoutError:
            raise self.error(
                f"{where}: pattern {self.text[:80]!r} took over {MATCH_SECONDS:g} s on one match of "
                f"{len(value)} characters (catastrophic backtracking); simplify it"
            ) from None

    def search(self, value: str, where: str) -> bool:
        return self._run("search", value, where)

    def fullmatch(self, value: str, where: str) -> bool:
        return self._run("fullmatch", value, where)
