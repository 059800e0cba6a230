"""Data planes: the one part that differs between transports (`base`), and each
`--kv-transport`'s plane: `shm` (with its files, `shm_files`), `tcp`, and the direct
writers (`direct`) `nixl` and `mooncake`."""
