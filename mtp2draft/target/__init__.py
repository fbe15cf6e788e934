"""The frozen target: online (a transformers model: features, decoding, dumps) and offline (dumped hidden states)
in `hidden`; the engines that produce dumps (`engine`, with `vllm_side/`, the code run by vLLM's own Python)."""
