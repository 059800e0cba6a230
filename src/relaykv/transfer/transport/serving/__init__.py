"""The serving side (P): the endpoint that lets readers have pages of held requests.

One background thread per endpoint (`server`), its records (`serve_jobs`), the allow-list
of which blocks a reader may have (`allow_list`), where readers let P write
(`registrations`), failure injection (`faults`) and an endpoint as its own process
(`standalone`).
"""
