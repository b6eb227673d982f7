"""Mechanism: a layer computed by its owner for every rank's rows (SiDP's Compute-as-a-Service).

- `cas`: `RemoteCompute.run`: non-owners ship their rows to the layer's owner, which runs the
  layer once on all rows (one fused GEMM) and returns each rank its slice; ranks with no rows send
  and receive nothing.
"""
