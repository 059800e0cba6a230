"""The documentation's commands, run as written (issue 23: every shell block in docs/ and the
README is a promise that it runs).

The rule, checked by test_doc_blocks.py:

* Every fenced block says what it is. `sh` (or `bash`, `shell`): commands, one per line,
  `\\` continuations and `#` comments allowed; a comment line such as `# host A: ...`
  says where the commands below it run. `console`: a transcript, `$ ` before each command
  and what it prints below it. Anything else (`text` for output, `json`, `python`, ...)
  is not a shell block.
* A shell block is either run by a test in this folder, which names it with
  `markdown_blocks.claim(doc, heading, first command's start, by=__name__)` at module level,
  or its first line says, visibly, why not: `# not run by tests: <reason>` (needs a GPU,
  installs packages, a nine-minute benchmark, a synopsis with placeholders).
* A test runs the block's own text (never a copy) in a `sandbox.Sandbox`, a private network,
  mount and PID namespace, so the fixed ports and addresses the docs use are free, and
  compares what a `console` block shows with what the command printed
  (`running.same_output`). Substitutions are only those the doc states (a port a command
  prints, `ARGS=--quick`).

Files: `markdown_blocks.py` (parsing, claims), `sandbox.py` (the namespaces), `running.py`
(servers vs one-shot commands, hosts, output comparison), one test module per group of
blocks that share a cluster.
"""
