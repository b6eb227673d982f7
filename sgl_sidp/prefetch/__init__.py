"""Mechanism: slot rings that fetch per-layer weights on a side stream, hidden behind compute.

See `ring` (`PrefetchSchedule`, `SlotPrefetcher`, `StreamOps`, `SimulatedStreams`, `sync_points`).
"""
