"""The fourth audit's hangs and runaway resources (issue 42), and the sweep's ``--address`` tracebacks.

Each case hung, ate memory or raised before its fix: ``sweep --address`` at a closed port retried for minutes
(now: one line within ``CONNECT_SECONDS``), a silent listener or a malformed, empty or client-less address
escaped as Ray's own exception; ``moe --prompts`` a FIFO blocked forever, ``/dev/zero`` read until memory ran
out; a 2 MB prompt was tokenized whole (20 s, +775 MB) before its 512-token cut. Every address contacted here
is on loopback. No test here starts Ray: each address is refused before ``ray.init`` (or ``ray.init`` is a stub).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentmerge.errors import ConfigError
from hostile import bounded_python, not_a_file, one_line_error

ray = pytest.importorskip("ray")
from agentmerge.sweep.cluster import check_address  # noqa: E402
from agentmerge.sweep.run import RaySession  # noqa: E402


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def silent_listener() -> Iterator[int]:
    """A loopback port that accepts connections and never says a word (not a Ray cluster)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not done.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield int(server.getsockname()[1])
    done.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


@pytest.fixture
def http_listener() -> Iterator[int]:
    """A loopback port that answers anything with an HTTP/1.1 error (a web server, not a Ray cluster)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)

    def answer() -> None:
        server.settimeout(5)
        try:
            conn = server.accept()[0]
        except OSError:
            return
        with conn:
            conn.recv(64)
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    yield int(server.getsockname()[1])
    thread.join()
    server.close()


# --------------------------------------------------------------------------- sweep --address


@pytest.mark.parametrize(
    "address",
    ["", "  ", "127.0.0.1", "127.0.0.1:", ":6379", "127.0.0.1:port", "127.0.0.1:0", "127.0.0.1:99999", "a/b:1"],
)
def test_a_malformed_address_is_one_line(address: str) -> None:
    with pytest.raises(ConfigError, match=r"write HOST:PORT"):
        check_address(address)


def test_a_closed_port_is_refused_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "grpc" else real(name, *a))
    port = closed_port()
    t0 = time.monotonic()
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        with pytest.raises(ConfigError, match=r"no Ray cluster answers there \(connection refused"):
            check_address(address)
    assert time.monotonic() - t0 < 5


def test_a_listener_that_is_not_ray_is_refused_within_the_bound(silent_listener: int, http_listener: int) -> None:
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=r"no Ray cluster answers there \(timed out within 1 s\)"):
        check_address(f"127.0.0.1:{silent_listener}", seconds=1)
    assert time.monotonic() - t0 < 4
    with pytest.raises(ConfigError, match="no gRPC answer"):
        check_address(f"127.0.0.1:{http_listener}", seconds=5)


def test_ray_client_address_without_ray_client(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "grpc" else real(name, *a))
    with pytest.raises(ConfigError, match=r"pip install 'ray\[client\]'"):
        check_address("ray://127.0.0.1:10001")


@pytest.mark.parametrize(
    "error",
    [
        ConnectionError("Could not find any running Ray instance. Please specify the one to connect to"),
        ValueError("Invalid address format: x"),
        RuntimeError("Failed to connect to GCS.\nsecond line"),
    ],
)
def test_rays_own_exceptions_from_init_are_one_line(monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    """``auto`` with no cluster (or whatever Ray raises once the address answered) is a ConfigError line."""

    def init(**kwargs: object) -> None:
        raise error

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    with pytest.raises(ConfigError) as caught:
        RaySession("auto", quiet=True).start()
    text = str(caught.value)
    assert text.startswith("--address 'auto': Ray could not start or join it") and "\n" not in text
    assert type(error).__name__ in text


def test_sweep_at_a_closed_port_is_one_line_quickly(
    tiny_family: tuple[Path, list[Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from test_sweep import write_sweep

    path = write_sweep(tmp_path, tiny_family)
    t0 = time.monotonic()
    argv = ["sweep", str(path), "--out", str(tmp_path / "out"), "--quiet", "--address", f"127.0.0.1:{closed_port()}"]
    one_line_error(argv, capsys, "no Ray cluster answers there", "ray start --head")
    assert time.monotonic() - t0 < 20
    assert not ray.is_initialized()


# --------------------------------------------------------------------------- moe prompts


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "folder"])
def test_a_prompts_file_that_is_not_a_regular_file_is_refused_without_reading(tmp_path: Path, kind: str) -> None:
    """Also with --dry-run: the prompts are read when the config is checked, before anything else."""
    path = not_a_file(tmp_path / "p.txt", kind)
    (tmp_path / "q.txt").write_text("abc\n")
    argv = ["moe", "b", "--model", "a1", "--prompts", str(path), "--model", "a2", "--prompts", str(tmp_path / "q.txt")]
    out = bounded_python(
        "import sys\nfrom agentmerge.cli import main\n"
        f"sys.exit(main({[*argv, '-o', str(tmp_path / 'o'), '--dry-run']!r}))\n",
        timeout=60,
    )
    assert "agentmerge: error:" in out and "not a regular file" in out and str(path) in out, out


def test_an_oversized_prompts_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from agentmerge.engine.moe.moe_config import MAX_PROMPTS_BYTES

    big = tmp_path / "p.txt"
    with open(big, "wb") as f:
        f.truncate(MAX_PROMPTS_BYTES + 1)  # sparse: nothing is written to disk
    (tmp_path / "q.txt").write_text("abc\n")
    argv = ["moe", "b", "--model", "a1", "--prompts", str(big), "--model", "a2", "--prompts", str(tmp_path / "q.txt")]
    one_line_error([*argv, "-o", str(tmp_path / "o")], capsys, str(big), "too large for a prompts file")


@pytest.fixture(scope="module")
def dense_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama base folder with its character tokenizer (and a chat template)."""
    import densefamily as df

    return df.family(tmp_path_factory.mktemp("fam"), "llama", 1)[0]


def test_a_long_prompt_is_cut_before_it_is_tokenized(dense_base: Path) -> None:
    """A 2 MB line: its first 512 tokens as the whole line's, in far less time and memory than the whole costs."""
    base = dense_base
    code = (
        "import resource, time\nfrom agentmerge.engine.moe.build import tokenize\n"
        f"base = {str(base)!r}\ntokenize(base, [['0'], ['a']], False)\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\nt0 = time.perf_counter()\n"
        "ids = tokenize(base, [['0123 abc ' * 250_000], ['a']], True)[0][0]\n"
        "seconds = time.perf_counter() - t0\n"
        "grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024\n"
        "print('RESULT', len(ids), round(seconds, 2), round(grew))\n"
    )
    out = bounded_python(code, timeout=120)
    line = next(x for x in out.splitlines() if x.startswith("RESULT")).split()
    assert int(line[1]) == 512 and float(line[2]) < 2.0 and int(line[3]) < 100, out  # before: 20 s, +775 MB


def test_the_cut_keeps_the_whole_prompts_first_tokens(dense_base: Path) -> None:
    """Against the whole text tokenized (the reference), plain and in the chat template."""
    import transformers

    from agentmerge.engine.moe.build import tokenize
    from agentmerge.engine.moe.router import MAX_TOKENS

    base = dense_base
    tok = transformers.AutoTokenizer.from_pretrained(base)
    prompts = ["ab " * 20_000, "x" * 100, "0123456789" * 3000]
    plain = tokenize(base, [prompts, ["a"]], False)[0]
    chat = tokenize(base, [prompts, ["a"]], True)[0]
    for p, got, got_chat in zip(prompts, plain, chat, strict=True):
        assert got == tok(p)["input_ids"][:MAX_TOKENS]
        wrapped = tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        assert got_chat == tok(wrapped, add_special_tokens=False)["input_ids"][:MAX_TOKENS]
