"""The frozen target: loaded with transformers for features and decoding (`hidden`); dumped for offline distillation
(`dumps`, by `backend`: transformers or vLLM) and the checks of a dump (`dump_checks`); where models run (`device`);
whether a draft or dump belongs to a target (`identity`); the serving engines' venvs (`environments`) and the code
vLLM's own Python runs (`vllm_side/`). docs/architecture.md has one line per module."""
