"""The serving engines: what mtp2draft knows and does with each (vLLM, SGLang, speculators' runtime). Each engine's
own venv (`environments`); which engine runs the target for a stage (`choice`: `dump-hidden --engine`, `evaluate
--engine`, `--regenerate`); vLLM started in its venv (`vllm_launch`), serving a target with or without a draft
(`vllm_serve`), measuring drafts from its counters (`vllm_evaluate`), dumping hidden states with its extraction
(`vllm_dump`); and the code vLLM's own Python runs (`vllm_side/`, never imported by mtp2draft).

What this package does not do: hold a family's engine facts (the specs' `[engines.*]` tables, `family.spec`), write
export formats (`formats/`), or decode speculatively itself (`evaluation.decode`). docs/architecture.md has one line
per module; docs/engines.md says what each engine release needs and cannot run."""
