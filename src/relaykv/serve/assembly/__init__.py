"""Engine assembly: `relaykv serve` flags -> a ready engine.

The engine options (`options`, byte sizes in `sizes`), model loading (`model_loading`,
`model_info`), the factory that builds the engine and sizes its pool (`engine_factory`),
P/D wiring (`pd_wiring`: `--role` and the transfer flags -> a connector) and the CPU
threads of engine processes (`cpu_threads`).
"""
