"""Mechanism: device memory shared across the processes of a node, and the checks that it can be.

- `manifest`: what a shared tensor is (`TensorSpec`) and how two processes' lists are compared.
- `moves`: the order an owner re-homes its tensors in, and the peak extra memory that costs.
- `vmm`: export/import of tensors through CUDA VMM and POSIX file descriptors
  (`TensorExporter`, `TensorImporter`, `VmmDriver`), built on SGLang's DWDP VMM helpers.
- `topology`: which GPU each SGLang replica uses and whether two GPUs can read each other (NVML).
"""
