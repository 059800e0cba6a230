"""HTTP and process plumbing the servers share: a uvicorn server whose SIGTERM drains
(`graceful`), the guard that cancels a handler's work when its client disconnects
(`disconnect`), secrets read from private files, never from a command line
(`secret_files`), the keys derived from the cluster secret (`derived_keys`), the one
supervisor of a child process (`child_process`), and the lazy "module:attribute" lookup
of the implementation registries (`lazy_entries`)."""
