"""Training and evaluation data: JSONL records -> token ids with a loss mask.

Two record shapes, one per line:
- `{"text": "..."}`: plain text; every token is a loss token.
- `{"messages": [{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}, ...]}`: a chat,
  rendered with the target's chat template; only assistant tokens are loss tokens. The assistant spans are found by
  rendering the conversation turn by turn (the template must render prefixes of a conversation as prefixes).

`regenerate` has the target write its own responses (greedy or sampled): drafts trained on the target's own outputs
accept more. Malformed lines are an error naming file and line, or are skipped and counted with `skip_bad`.

What this module does not do: batching or hidden states (`train/recipe.py`, `target/hidden.py`); it never prints text.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch

from mtp2draft.errors import DataError
from mtp2draft.settings import derived_seed

T = TypeVar("T")

# A JSONL line longer than this is malformed (read in pieces and skipped, never held whole).
MAX_LINE_BYTES = 64 << 20
# Characters of a text kept per token of --max-length before tokenising: a token rarely spans more than a few
# characters, so this never cuts what the truncated sequence would keep, and a 40 MB record costs kilobytes.
CHARS_PER_TOKEN = 32


@dataclass
class Example:
    input_ids: list[int]
    loss_mask: list[bool]
    prompt_length: int = 0
    """Tokens before the first loss token (the prompt, for evaluation and regeneration)."""
    record: dict[str, Any] = field(default_factory=dict, repr=False)


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    from mtp2draft.progress import quiet_transformers

    try:
        with quiet_transformers():
            return AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(f"the target at {path} has no usable tokenizer ({first})") from exc


def check_data_file(path: str | Path, option: str = "data file") -> Path:
    """A data file that exists and is a regular file (a directory, a FIFO or a device is not data), as the path
    `option` (e.g. `--eval-data`) named it; one DataError line otherwise."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{option} {path} does not exist")
    if not path.is_file():
        raise DataError(f"{option} {path} is {_file_kind(path)}, not a file of records")
    return path


def _file_kind(path: Path) -> str:
    """What a path that is not a regular file is, in words: "a directory", "a FIFO (named pipe)", ..."""
    for test, words in (
        (path.is_dir, "a directory"),
        (path.is_fifo, "a FIFO (named pipe)"),
        (path.is_char_device, "a character device"),
        (path.is_block_device, "a block device"),
        (path.is_socket, "a socket"),
    ):
        if test():
            return words
    return "not a regular file"


def read_records(path: str | Path, skip_bad: bool = False) -> tuple[list[dict[str, Any]], int]:
    """Parsed and checked records, and how many malformed lines were skipped."""
    numbered, skipped = _numbered_records(path, skip_bad)
    return [record for _, record in numbered], skipped


def _numbered_records(path: str | Path, skip_bad: bool) -> tuple[list[tuple[int, dict[str, Any]]], int]:
    """(line number, record) of each usable line, and how many malformed lines were skipped."""
    path = check_data_file(path)
    records, skipped = [], 0
    for lineno, raw in enumerate(_lines(path), 1):
        if not raw.strip():
            continue
        try:
            if len(raw) > MAX_LINE_BYTES:
                raise ValueError(f"line is longer than {MAX_LINE_BYTES >> 20} MiB")
            record = json.loads(raw.decode("utf-8"))
            _check(record)
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as exc:
            if skip_bad:
                skipped += 1
                continue
            if isinstance(exc, json.JSONDecodeError):
                reason = f"not valid JSON ({exc.msg})"
            elif isinstance(exc, UnicodeDecodeError):
                reason = f"not UTF-8 (byte {exc.start} of the line)"
            else:
                reason = str(exc)
            raise DataError(f"{path}:{lineno}: {reason} (pass --skip-bad to skip such lines)") from None
        records.append((lineno, record))
    if not records:
        raise DataError(
            f"{path} holds no usable records" + (f" ({skipped} malformed lines skipped)" if skipped else "")
        )
    return records, skipped


def rendered(path: str | Path, render: Callable[[dict[str, Any]], T], skip_bad: bool = False) -> tuple[list[T], int]:
    """`render(record)` of each record of `path` (`encode`, `prompt_ids`), and how many lines were skipped: a chat
    the target's template cannot render (a role it does not know, a tool turn without the fields it reads, a template
    that raises) is one line naming the file and line, or with `skip_bad` skipped and counted like a malformed one."""
    numbered, skipped = _numbered_records(path, skip_bad)
    out = []
    for lineno, record in numbered:
        try:
            out.append(render(record))
        except DataError as exc:
            if skip_bad:
                skipped += 1
                continue
            raise DataError(f"{path}:{lineno}: {exc} (pass --skip-bad to skip such lines)") from None
    if not out:
        raise DataError(f"{path} holds no usable records ({skipped} lines skipped)")
    return out, skipped


def _lines(path: Path):
    """Raw lines of a file; a line over MAX_LINE_BYTES is read in pieces and yielded as an over-long stub."""
    with open(path, "rb") as fh:
        while True:
            line = fh.readline(MAX_LINE_BYTES + 1)
            if not line:
                return
            if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                while True:  # drain the rest of the line without keeping it
                    more = fh.readline(1 << 20)
                    if not more or more.endswith(b"\n"):
                        break
            yield line


def _cap(text: str, max_length: int, keep_end: bool = False) -> str:
    """At most `max_length * CHARS_PER_TOKEN` characters of `text` (its end for prompts, which keep the last tokens)."""
    limit = max_length * CHARS_PER_TOKEN
    if len(text) <= limit:
        return text
    return text[-limit:] if keep_end else text[:limit]


def _check(record: Any) -> None:
    if not isinstance(record, dict):
        raise ValueError("a record must be a JSON object with 'text' or 'messages'")
    if "text" in record:
        if not isinstance(record["text"], str) or not record["text"]:
            raise ValueError("'text' must be a non-empty string")
        return
    messages = record.get("messages")
    if messages is None:
        raise ValueError("a record needs 'text' or 'messages'")
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ValueError(f"message {i} needs a string 'role' (and a string 'content')")
        if not isinstance(m.get("content"), str):
            got = "missing" if "content" not in m else f"{_json_kind(m['content'])}, not a string"
            raise ValueError(f"message {i}'s 'content' is {got}: give its text as one string")
        if m["role"] not in ("system", "user", "assistant", "tool"):
            raise ValueError(f"unknown role {m['role']!r}")
    opening = next((m["role"] for m in messages if m["role"] != "system"), None)
    if opening is None:
        raise ValueError("the chat holds system messages only: it needs a user turn")
    if opening == "assistant":  # no prompt to answer: templates render nothing (or fail) before its first turn
        raise ValueError("the chat opens with the assistant's turn: it needs a user turn before it")


def _json_kind(value: Any) -> str:
    """How JSON names `value`'s type: null, a list, an object, a number."""
    kinds = {type(None): "null", list: "a list", dict: "an object", bool: "a boolean"}
    return kinds.get(type(value), "a number")


def _render(tokenizer, messages: list[dict[str, str]], generation_prompt: bool) -> list[int]:
    """The chat rendered by the target's template; a template that raises on it (jinja2's `raise_exception`, a field
    it reads and the message lacks) is a `DataError` with the template's first line."""
    try:
        out = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=generation_prompt)
    except Exception as exc:  # jinja2's TemplateError (`raise_exception`), or whatever the template's code raised
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise DataError(f"the target's chat template cannot render this chat ({type(exc).__name__}: {first})") from None
    if isinstance(out, dict) or hasattr(out, "input_ids"):
        out = out["input_ids"]
    return list(out)


def encode(record: dict[str, Any], tokenizer, max_length: int) -> Example:
    """Token ids and loss mask of one record, truncated to max_length."""
    if "text" in record:
        ids = tokenizer(_cap(record["text"], max_length), add_special_tokens=True)["input_ids"][:max_length]
        return Example(ids, [True] * len(ids), 0, record)
    if not getattr(tokenizer, "chat_template", None):
        raise DataError("chat records need the target's chat template, and its tokenizer has none; use {'text': ...}")
    messages = [{**m, "content": _cap(m["content"], max_length)} for m in record["messages"]]
    ids: list[int] = []
    mask: list[bool] = []
    for i, message in enumerate(messages):
        if message["role"] == "assistant":
            before = _render(tokenizer, messages[:i], generation_prompt=True)
            after = _render(tokenizer, messages[: i + 1], generation_prompt=False)
        else:
            before, after = ids, _render(tokenizer, messages[: i + 1], generation_prompt=False)
        if after[: len(ids)] != ids or before[: len(ids)] != ids:
            raise DataError("the chat template does not render conversation prefixes as prefixes")
        if message["role"] == "assistant":
            mask += [False] * (len(before) - len(ids)) + [True] * (len(after) - len(before))
        else:
            mask += [False] * (len(after) - len(ids))
        ids = after
    prompt = mask.index(True) if True in mask else len(ids)
    return Example(ids[:max_length], mask[:max_length], min(prompt, max_length), record)


def read_examples(path: str | Path, tokenizer, max_length: int, skip_bad: bool = False) -> tuple[list[Example], int]:
    examples, skipped = rendered(path, lambda r: encode(r, tokenizer, max_length), skip_bad)
    examples = [e for e in examples if sum(e.loss_mask) >= 3]
    if not examples:
        raise DataError(f"{path}: no record has enough loss tokens after truncation to {max_length}")
    return examples, skipped


def prompt_ids(record: dict[str, Any], tokenizer, max_length: int) -> list[int]:
    """The prompt of a record for generation: chats up to the last user turn (+ generation prompt); text whole."""
    if "text" in record:
        return tokenizer(_cap(record["text"], max_length, keep_end=True), add_special_tokens=True)["input_ids"][
            -max_length:
        ]
    messages = [{**m, "content": _cap(m["content"], max_length, keep_end=True)} for m in record["messages"]]
    while messages and messages[-1]["role"] == "assistant":
        messages.pop()
    if not messages:
        raise DataError("a chat record without a user turn has no prompt")
    return _render(tokenizer, messages, generation_prompt=True)[-max_length:]


SAMPLE_TEMPERATURE = 0.8  # `--regenerate --sample`: every backend samples the target's responses at this temperature


@dataclass(frozen=True)
class Regeneration:
    """How the target writes its own responses (`--regenerate`), whichever engine runs it: at most
    `max_new_tokens` each, greedy unless `sample` (at `temperature`, seeded per batch by `seed`)."""

    max_new_tokens: int
    sample: bool = False
    temperature: float = SAMPLE_TEMPERATURE
    seed: int = 0


def regeneration_prompts(examples: Sequence[Example], max_new_tokens: int) -> list[tuple[list[int], int]]:
    """(prompt, new-token budget) per example, as every backend regenerates it (`regenerate`, and vLLM's in
    `engines.vllm_serve.regenerate_in_vllm`). Chats: the conversation before the first assistant turn, up to
    `max_new_tokens`. Text: the first half of the tokens, and as many new tokens as the second half had."""
    jobs = []
    for ex in examples:
        prompt = ex.input_ids[: ex.prompt_length] if ex.prompt_length else ex.input_ids[: len(ex.input_ids) // 2]
        budget = max_new_tokens if ex.prompt_length else min(max_new_tokens, len(ex.input_ids) - len(prompt))
        jobs.append((list(prompt), max(budget, 1)))
    return jobs


def with_response(example: Example, job: tuple[list[int], int], generated: Sequence[int], eos: int | None) -> Example:
    """`example` with its loss span replaced by the target's `generated` tokens: cut to the job's budget and after
    the first eos (kept: the draft learns to predict the end too)."""
    prompt, budget = job
    new = list(generated)[:budget]
    if eos is not None and eos in new:
        new = new[: new.index(eos) + 1]
    return Example(prompt + new, [False] * len(prompt) + [True] * len(new), len(prompt), example.record)


def regenerate(
    examples: Sequence[Example],
    target,
    tokenizer,
    how: Regeneration,
    prompts_per_batch: int = 16,
    progress=lambda _: None,
) -> list[Example]:
    """Replace each example's loss span with the target's own continuation of its prompt.

    Chats: the prompt is the conversation before the first assistant turn. Text: the first half of the tokens, and
    as many new tokens as the second half had, at most `how.max_new_tokens`. Prompts are generated in left-padded
    batches of similar length; greedy unless `how.sample` (at its temperature, seeded per batch by its seed).
    Generation stops at the tokenizer's eos token."""
    sample, temperature, seed = how.sample, how.temperature, how.seed
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    jobs = regeneration_prompts(examples, how.max_new_tokens)
    order = sorted(range(len(jobs)), key=lambda i: (len(jobs[i][0]), jobs[i][1]))
    out: list[Example | None] = [None] * len(jobs)
    device = torch.device(target.device)
    cuda = [torch.cuda.current_device() if device.index is None else device.index] if device.type == "cuda" else []
    done = 0
    for start in range(0, len(order), prompts_per_batch):
        chunk = order[start : start + prompts_per_batch]
        width = max(len(jobs[i][0]) for i in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, i in enumerate(chunk):  # left padding: every prompt ends at the last column
            prompt = jobs[i][0]
            ids[row, width - len(prompt) :] = torch.tensor(prompt)
            mask[row, width - len(prompt) :] = 1
        # generate() takes no generator: sampling draws from torch's global RNG, seeded per batch inside a fork so
        # that a run's samples follow from (seed, batch) and the caller's RNG state is left as it was
        with torch.no_grad(), torch.random.fork_rng(devices=cuda):
            if sample:
                torch.manual_seed(derived_seed(seed, start))
            generated = target.model.generate(
                ids.to(target.device),
                attention_mask=mask.to(target.device),
                max_new_tokens=max(jobs[i][1] for i in chunk),
                do_sample=sample,
                temperature=temperature if sample else None,
                top_p=None,
                top_k=None,
                pad_token_id=pad,
                eos_token_id=eos,
            )[:, width:].tolist()
        for row, i in enumerate(chunk):
            out[i] = with_response(examples[i], jobs[i], generated[row], eos)
        done += len(chunk)
        progress(f"regenerated {done}/{len(jobs)}")
    return [e for e in out if e is not None]
