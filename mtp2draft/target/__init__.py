"""The frozen target: online (a transformers model: features, decoding, dumps) and offline (dumped hidden states)
in `hidden`; where models run (`device`); whether a draft or dump belongs to a target (`identity`); the checks of a dump before it trains (`dump_checks`); the engines that produce dumps (`engine`, with `vllm_side/`, the code run by vLLM's own Python)."""
