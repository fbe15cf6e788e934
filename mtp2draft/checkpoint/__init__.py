"""The source checkpoint: resolving a SOURCE, reading its index and headers, fetching only the tensors a conversion
needs (`reader`), where the bytes come from — local files or Hub byte ranges (`sources`), bounded Hub requests
(`network`) and the quantizations checkpoints ship (`fp8`).

Torch-free to import: each module imports what it needs itself.
"""
