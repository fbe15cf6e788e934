"""The draft: its kinds and directory file names (`kinds`, torch-free), the native MTP and EAGLE-3 modules and their
on-disk form (`modules`), the checkpoint <-> module key mapping of an MTP layer (`layout`) and the EAGLE-3 config
codec (`eagle3_config`) and the typed, self-validating config.json of every draft layout (`config`).

This package's `__init__` imports nothing, so `mtp2draft.kinds` stays torch-free.
"""
