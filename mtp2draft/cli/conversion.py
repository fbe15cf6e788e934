"""`specs`, `inspect`, `convert`: what families exist, what a checkpoint holds, and turning its MTP layer into
a draft (library: `family.spec`, `conversion`)."""

from __future__ import annotations

from typing import Any

from mtp2draft.cli import output
from mtp2draft.cli.options import AsJson, Out, Overwrite, Source, settings
from mtp2draft.cli.root import app, log
from mtp2draft.settings import ConvertConfig, HubAccess


@app.command()
def specs(as_json: AsJson = False) -> None:
    """List the checkpoint families mtp2draft can convert (from the spec registry), the DSpark drafters it reads
    (model_specs/dspark/), then those it knowingly does not, each with its reason.

    Example: `mtp2draft specs --json`
    """
    from mtp2draft.family.dspark import layouts
    from mtp2draft.family.not_supported import rows as not_supported
    from mtp2draft.family.spec import registry

    rows = [{**s.summary(), "supported": True} for s in registry().values()]
    rows += [layout.summary() for layout in layouts().values()]
    rows += [row.summary() for row in not_supported().values()]
    print(output.to_json(rows) if as_json else output.specs_text(rows))


@app.command()
@settings(hub=HubAccess)
def inspect(source: Source, hub: Any, as_json: AsJson = False) -> None:
    """Show a checkpoint's family, its MTP layers and their tensors, and what a conversion would fetch.

    Reads only config.json, the index and safetensors headers.

    Examples: `mtp2draft inspect deepseek-ai/DeepSeek-V3` · `mtp2draft inspect ./my-checkpoint --json`
    """
    from mtp2draft.conversion import inspect_checkpoint

    info = inspect_checkpoint(source, hub)
    print(output.to_json(info) if as_json else output.inspect_text(info))


@app.command()
@settings(config=ConvertConfig, hub=HubAccess)
def convert(
    source: Source, out: Out, config: Any, hub: Any, overwrite: Overwrite = False, as_json: AsJson = False
) -> None:
    """Convert the MTP layer of a checkpoint into a draft: native MTP (`--to mtp`) or EAGLE-3 (`--to eagle3`).

    Fetches only the MTP layer's bytes (byte ranges from the Hub, cached) and dequantises FP8.
    The output directory appears complete or not at all.

    Examples:

    * `mtp2draft convert deepseek-ai/DeepSeek-V3 --out ds3-mtp`
    * `mtp2draft convert zai-org/GLM-4.5-Air --to eagle3 --out glm-eagle3 --dtype bfloat16`
    * `mtp2draft convert examples/targets/tiny-mimo-3mtp --all-layers --out mimo3-chain` (its three MTP layers, chained)
    """
    from mtp2draft.conversion import convert

    result = convert(source, out, config, hub=hub, overwrite=overwrite, progress=log)
    print(output.to_json(output.convert_summary(result)) if as_json else output.convert_text(result))
