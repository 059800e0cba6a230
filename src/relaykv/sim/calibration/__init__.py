"""Calibration: measure one machine and fit the `HardwareSpec` the simulator runs on
(`relaykv sim calibrate`, docs/simulator.md "Calibration").

* `cli`: the command, and the runner and transport timings it makes;
* `fit`: the cost model's fit to the runner's timed steps, and the link's to the reads;
* `serving`: a real local cluster served the calibration workload, and the serving
  overheads read from its engines' histograms;
* `in_cluster`: what the runner costs inside that served cluster, from its step logs (the
  shared host's slowdown included).
"""
