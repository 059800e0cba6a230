"""HTTP and process plumbing the servers share: a uvicorn server whose SIGTERM drains
(`graceful`), the guard that cancels a handler's work when its client disconnects
(`disconnect`) and secrets read from private files, never from a command line
(`secret_files`)."""
