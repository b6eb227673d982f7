"""Shift Parallelism (Hidayetoglu et al.; snowflakedb/ArcticInference): Ulysses SP for big batches, full TP for small
ones, on one KV cache. So far its CPU-tested core: the KV-invariant head order (`heads`) and the Ulysses all-to-alls
(`ulysses`), and the shift configuration's weights as views of the base ones (`views`);
`--sidp-mode shift` is not registered yet."""
