"""relaykv.common: the shared floor under every layer.

Pure code any layer may import: the records that cross a layer or process boundary
(`messages/`), the small HTTP/process plumbing every server shares (`plumbing/`), the
synthetic workloads `bench serve` sends and the simulator runs (`workloads/`) and the rules
two layers both apply: an HF config's layer kinds (`layer_kinds`), the built-in models'
names (`model_names`).
Its rule: it imports nothing of relaykv outside `common/` (stdlib and third-party only,
never torch), so every layer can stand on it without an upward import
(tools/check_layers.py, docs/architecture.md).
"""
