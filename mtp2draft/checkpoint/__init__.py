"""The source checkpoint: resolving a SOURCE, reading its index and headers, fetching only the tensors a conversion
needs (`reader`), where the bytes come from — local files or Hub byte ranges (`sources`), bounded Hub requests
(`network`), the quantizations checkpoints ship (`quant`, with `fp8` and `fp4`) and the check of every tensor read
(`tensor_checks`). docs/architecture.md has one line per module.

Torch-free to import: each module imports what it needs itself.
"""
