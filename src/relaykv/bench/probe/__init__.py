"""`relaykv probe`: the fixed-engine P/D prefix-cache probe of the upstream report
(vLLM PR #56449, docs/design.md §11)."""
