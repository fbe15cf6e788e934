"""Per-family data: the spec files' schema and registry (`spec`) and the named load transforms specs refer to
(`transforms`). What differs between checkpoint families lives here and in `model_specs/`, never in stage code."""
