"""Distillation: the recipe (`recipe`) and its settings (`settings`), the training-time-test math (`ttt`), where
batches and the teacher come from (`teacher`), EAGLE-3 vocabulary and calibration (`calibrate`), checkpoints and resume
(`state`), the held-out guard (`heldout`), torchrun / FSDP2 (`parallel`), trainable subsets (`subsets`, torch-free) and
the memory plan (`memory`). docs/architecture.md has one line per module."""
