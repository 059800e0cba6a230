"""Running a doc's commands in a `Sandbox` the way its prose says: servers started and
waited for, one-shot commands run to completion, hosts chosen by the block's comments, and
what a `console` block shows compared with what the command printed."""

from __future__ import annotations

import itertools
import re
import shlex
from collections.abc import Iterable

from tests.docs.markdown_blocks import Block, Command
from tests.docs.sandbox import Sandbox, Server

# A documented command that keeps running (it serves), by its first words, and the port it
# listens on when the command names none.
SERVERS = {
    ("relaykv", "serve"): 8000,
    ("relaykv", "router"): 8000,
    ("relaykv", "up"): None,  # random ports, printed
    ("vllm-router",): 30000,
    ("sglang-router", "launch"): 30000,
}
# The comments that name a host in the two-host blocks ("# host A: the prefill engine"),
# and the `ip netns` namespace that stands for it (docs/pd.md's namespace block).
HOSTS = {"host A": "rkvA", "host B": "rkvB", "anywhere": "rkvA"}


def words(command: Command) -> list[str]:
    """The command's words, leading `VAR=value` assignments dropped."""
    argv = shlex.split(command.text.replace("\\\n", " "), comments=True)
    while argv and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", argv[0]):
        argv.pop(0)
    return argv


def is_server(command: Command) -> bool:
    argv = words(command)
    return any(tuple(argv[: len(key)]) == key for key in SERVERS)


def is_router(command: Command) -> bool:
    """A front end: it checks its engines at startup, so they must be up first."""
    return is_server(command) and words(command)[:2] != ["relaykv", "serve"]


def listen_url(command: Command) -> str:
    """http://HOST:PORT a server command listens on (its --host/--port, else defaults)."""
    argv = words(command)
    default = next(port for key, port in SERVERS.items() if tuple(argv[: len(key)]) == key)
    host, port = "127.0.0.1", default
    for flag, value in itertools.pairwise(argv):
        if flag == "--host":
            host = value
        elif flag == "--port":
            port = int(value)
    if port is None:
        raise ValueError(f"`{command.first_line}` prints its URL; it names no port")
    return f"http://{host}:{port}"


def host_of(command: Command) -> str | None:
    """The namespace of the host the block's comment above `command` names; None: any."""
    for name, netns in HOSTS.items():
        if command.context.startswith(f"# {name}"):
            return netns
    return None


def run_block(
    sandbox: Sandbox, block: Block, *, hosts: bool = False, skip: Iterable[str] = ()
) -> list[Server]:
    """Every command of `block` in order, as a reader runs them: the rest to completion,
    servers started and left running. Engines in a row start together (on their hosts); a
    router, a one-shot command and the end of the block wait until every server started
    so far answers `/health`. With `hosts`, each command runs on the host its comment
    names. `skip`: first-line prefixes of commands already running (a block that repeats
    another's engines)."""
    servers: list[Server] = []
    pending: list[tuple[Server, str, str | None]] = []

    def settle() -> None:
        for server, url, host in pending:
            sandbox.wait_http(f"{url}/health", server, host=host)
        pending.clear()

    for i, command in enumerate(block.commands()):
        if any(command.first_line.startswith(s) for s in skip):
            continue
        host = host_of(command) if hosts else None
        if not is_server(command) or is_router(command):
            settle()
        if not is_server(command):
            sandbox.run(command.text, host=host)
            continue
        name = f"{block.doc.replace('/', '_')}-{block.line}-{i}-{words(command)[0]}"
        server = sandbox.start(command.text, name, host=host)
        pending.append((server, listen_url(command), host))
        servers.append(server)
    settle()
    return servers


def table(text: str) -> list[str]:
    """The whitespace-normalised lines of a printed table (or any output)."""
    return [" ".join(line.split()) for line in text.strip().splitlines() if line.strip()]


def same_output(
    documented: Iterable[str],
    printed: str,
    *,
    ignore: Iterable[str] = (),
    any_order: bool = False,
    excerpt: bool = False,
) -> None:
    """What a console block shows equals what the command printed, line by line, after
    replacing each `ignore` pattern (ports, temp paths) by `*` on both sides. `any_order`:
    the same lines in any order (members that start concurrently report in any order).
    `excerpt`: the doc shows some of the lines (a line `...` marks a cut); they must appear
    in the printed output, in order."""
    patterns = [re.compile(p) for p in ignore]

    def norm(lines: list[str]) -> list[str]:
        out = []
        for line in lines:
            for pattern in patterns:
                line = pattern.sub("*", line)
            out.append(line)
        return out

    want = norm(table("\n".join(documented)))
    got = norm(table(printed))
    shown = "the doc shows:\n" + "\n".join(want) + "\nthe command printed:\n" + "\n".join(got)
    if excerpt:
        rest = iter(got)
        missing = [line for line in want if line != "..." and line not in rest]
        assert not missing, f"{shown}\nnot printed (in this order): {missing}"
        return
    if any_order:
        want, got = sorted(want), sorted(got)
    assert got == want, shown
