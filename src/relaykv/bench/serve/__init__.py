"""`relaykv bench serve`: the vLLM-compatible streaming load generator."""
