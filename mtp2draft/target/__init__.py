"""The frozen target: loaded with transformers for features and decoding (`hidden`); dumped for offline distillation
(`dumps`, written from `hidden` or from vLLM's extraction, `engines.vllm_dump`) and the checks of a dump
(`dump_checks`); where models run (`device`); whether a draft or dump belongs to a target (`identity`). The serving
engines live in `engines/`. docs/architecture.md has one line per module."""
