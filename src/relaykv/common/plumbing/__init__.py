"""HTTP and process plumbing the servers share: a uvicorn server whose SIGTERM drains
(`graceful`) and secrets read from private files, never from a command line
(`secret_files`)."""
