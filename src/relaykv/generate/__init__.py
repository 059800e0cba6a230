"""`relaykv generate`: offline generation from the command line, over the engine and a
model in one process (no server)."""
