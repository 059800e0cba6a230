"""`relaykv cache-probe`: what will my hit be? Tooling over the cache contract, no model.

The probe (`probe`), its command (`cli`) and the brute-force oracle of the local lookup
(`oracle`) the tests check `kvcache`'s lookup against. Torch-free; imports `kvcache` only.
"""
