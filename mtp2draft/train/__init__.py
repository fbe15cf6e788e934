"""Distillation: the recipe (`recipe`), the training-time-test math (`ttt`), where batches and the teacher come from
(`teacher`), EAGLE-3 vocabulary and calibration (`calibrate`), checkpoints and resume (`state`), torchrun / FSDP2
(`parallel`), trainable subsets (`subsets`, torch-free) and the memory plan (`memory`)."""
