"""The draft: the native MTP modules (`modules`, `chain`, `hyper`, built through `build`) and the EAGLE-3 module
(`modules`), their configs (`config`, `block_config`, `eagle3_config`) and directories (`disk`), and the checkpoint <->
module key mapping of an MTP layer (`layout`). docs/architecture.md has one line per module.

This package's `__init__` imports nothing, so its torch-free modules (`eagle3_config`) stay torch-free.
"""
