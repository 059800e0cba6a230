"""HTTP and process plumbing the servers share: a uvicorn server whose SIGTERM drains
(`graceful`), secrets read from private files, never from a command line
(`secret_files`), and the keys derived from the cluster secret (`derived_keys`)."""
