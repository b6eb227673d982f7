"""Shift Parallelism (Hidayetoglu et al.; snowflakedb/ArcticInference): Ulysses SP for big forwards, full TP for
small ones, on one KV cache. `--overlay-mode shift`: settings and checks (`feature`, `settings`), the hook bodies
(`runtime`), shard-major base weights with the TP shards as views (`views`), the all-to-alls (`ulysses`) and the
head order of the two configurations (`heads`)."""
