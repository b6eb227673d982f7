"""Control layer: the scheduler's batch signal that later mode switches are driven by."""
