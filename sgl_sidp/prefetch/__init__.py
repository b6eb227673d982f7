"""Mechanism: slot rings that fetch per-layer weights on a side stream, hidden behind compute.

- `ring`: `PrefetchSchedule`, `SlotPrefetcher`, `StreamOps` (CUDA), `SimulatedStreams` (CPU), `sync_points`.
- `binding`: `SlotBinding`, which points modules' parameters at the slots and gives the hook points.
"""
