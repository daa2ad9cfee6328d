"""Run the evaluation with accelerate: windows split across processes, results gathered once.

Each process holds the whole model and scores its contiguous share of the windows
(``split_between_processes``, uneven shares allowed, no padding); per-window sums are gathered once
per (method, length) and checked to cover every window exactly once, then summed in window order, so
1 and N processes give the same number.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import gather_object
from tqdm.auto import tqdm

from hf_posenc import get_patch, patch, unpatch
from hf_posenc.architectures import positions_of
from hf_posenc.config import params_to_dict
from hf_posenc.eval.data import (
    TextSource,
    Window,
    WindowPlan,
    build_windows,
    check_protocol,
    load_texts,
    tokenize_texts,
)
from hf_posenc.eval.passkey import accuracy_grid, build_prompt, ends_the_number, random_keys
from hf_posenc.eval.perplexity import (
    DEFAULT_CHUNK_SIZE,
    check_head_decomposition,
    greedy_continuation,
    perplexity,
    window_nll,
)
from hf_posenc.eval.results import (
    check_output,
    device_description,
    load_previous,
    plot_passkey_heatmap,
    plot_ppl_vs_length,
    sort_results,
    versions,
    write_csv,
    write_json,
)
from hf_posenc.registry import get_method
from hf_posenc.spec import NONE_METHOD, format_method_spec, parse_method_spec

logger = logging.getLogger("hf_posenc")

RESULTS_JSON = "results.json"
PASSKEY_JSON = "passkey.json"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class ModelSource:
    """A Hub id or local folder, optionally a GGUF file in it, and the dtype (``auto``: bf16 on GPU)."""

    name: str
    gguf_file: str | None = None
    dtype: str = "auto"

    @property
    def label(self) -> str:
        """Short name for tables and plots: the Hub id, or folder/file of a GGUF."""
        return f"{Path(self.name).name}/{self.gguf_file}" if self.gguf_file else self.name

    def resolved_dtype(self, device: torch.device) -> str:
        if self.dtype != "auto":
            return self.dtype
        return "bfloat16" if device.type == "cuda" else "float32"


def normalize_methods(specs: list[str]) -> list[str]:
    """Check every method spec without a model; returns canonical specs.

    Raises:
        `ValueError`: a spec does not parse, names an unknown method or parameter, or has a bad value.
    """
    for spec in specs:
        method_identity(spec)
    return [format_method_spec(*parse_method_spec(spec)) for spec in specs]


def method_identity(spec: str) -> tuple[str, dict[str, Any]]:
    """The registered method and its built parameters (defaults filled in): equal for specs that
    compute the same thing, such as ``pi:factor=2`` and ``linear:factor=2.0``.

    What depends on the model (the trained context when not given) is left unresolved.
    """
    name, params = parse_method_spec(spec)
    if name == NONE_METHOD:
        if params:
            raise ValueError(f"--method {spec!r}: 'none' is the unpatched model and takes no parameters.")
        return NONE_METHOD, {}
    method = get_method(name)  # raises naming the unknown method and the available ones (aliases accepted)
    try:
        built = method.make_params(**params)
    except (TypeError, ValueError) as error:
        raise ValueError(f"--method {spec!r}: {error}") from None
    return method.name, params_to_dict(built)


def refuse_duplicates(
    specs: list[str],
    existing: Sequence[str] = (),
    where: Path | str = "",
    identity: Callable[[str], tuple[str, dict[str, Any]]] = method_identity,
) -> None:
    """Raise ``ValueError`` naming both specs when two of ``specs``, or one of them and a row already in
    the results file ``where`` (``existing``), are the same method (equal ``identity``)."""
    seen = _identities_of_rows([spec for spec in existing if spec not in specs], identity)
    for spec in specs:
        this = identity(spec)
        for other, other_identity in seen:
            if this != other_identity:
                continue
            if other in existing:
                raise ValueError(
                    f"--method {spec!r} is the same method with the same parameters as {other!r}, already in "
                    f"{where}; write it as {other!r} to keep that row, or choose another --output folder."
                )
            raise ValueError(
                f"--method {other!r} and --method {spec!r} are the same method with the same parameters; give it once."
            )
        seen.append((spec, this))


def resolved_identity(spec: str, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The method and the parameters a model resolved for it (its trained context filled in; the ALiBi
    backend, which does not change the numbers, left out): ``yarn:factor=4`` and
    ``yarn:factor=4,original_max_position_embeddings=8192`` are one method on a model trained on 8192."""
    name = method_identity(spec)[0]
    return name, {key: value for key, value in params.items() if key != "backend"}


def _identities_of_rows(
    specs: list[str], identity: Callable[[str], tuple[str, dict[str, Any]]]
) -> list[tuple[str, tuple[str, dict[str, Any]]]]:
    """``(spec, identity)`` of rows already written; a row an older version wrote that no longer builds
    is left out (no valid spec can be the same method)."""
    identities = []
    for spec in specs:
        try:
            identities.append((spec, identity(spec)))
        except ValueError:
            continue
    return identities


@contextmanager
def applied(model, spec: str, *, quiet: bool = False) -> Iterator[dict[str, Any]]:
    """Patch ``model`` with ``spec`` for the duration (``none``: unchanged); yields the resolved params.

    ``quiet``: without hf_posenc's notes on patching (such as the trained context it assumed), for a
    method already applied once (by :func:`_load_checked`), so each note is logged once per run.
    """
    name, params = parse_method_spec(spec)
    if name == NONE_METHOD:
        yield {}
        return
    with _patch_notes_hidden() if quiet else nullcontext():
        patch(model, name, **params)
    try:
        yield dict(get_patch(model).params)
    finally:
        unpatch(model)


@contextmanager
def _patch_notes_hidden() -> Iterator[None]:
    """hf_posenc's log below errors hidden for the duration."""
    logger = logging.getLogger("hf_posenc")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def load_model(source: ModelSource, device: torch.device):
    """The model, in eval mode, on ``device``."""
    from transformers import AutoModelForCausalLM

    kwargs = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    dtype = DTYPES[source.resolved_dtype(device)]
    return AutoModelForCausalLM.from_pretrained(source.name, dtype=dtype, **kwargs).to(device).eval()


def load_tokenizer(source: ModelSource):
    """The tokenizer of ``source`` (cheap next to the model: loaded first, to check the data)."""
    from transformers import AutoTokenizer

    kwargs = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    return AutoTokenizer.from_pretrained(source.name, **kwargs)


def trained_context(config) -> int:
    """The context the model was trained on: ``original_max_position_embeddings`` if set, else the max."""
    rope = getattr(config, "rope_parameters", None) or {}
    original = rope.get("original_max_position_embeddings") if isinstance(rope, dict) else None
    return int(original or getattr(config, "max_position_embeddings", None) or config.n_positions)


def resolve_bos(bos: str, tokenizer) -> int | None:
    """The BOS id to prepend to every window, or None. ``auto``: prepend iff the tokenizer adds one."""
    if bos == "none":
        return None
    if tokenizer.bos_token_id is None:
        if bos == "prepend":
            raise ValueError("--bos prepend was asked but the tokenizer has no BOS token.")
        return None
    if bos == "prepend":
        return tokenizer.bos_token_id
    adds = tokenizer("a", add_special_tokens=True)["input_ids"][:1] == [tokenizer.bos_token_id]
    return tokenizer.bos_token_id if adds else None


def _batches(indices: list[int], windows: list[Window], bos: bool, batch_size: int) -> Iterator[list[int]]:
    """Consecutive windows of equal input length and scored offset, at most ``batch_size`` together."""
    batch: list[int] = []
    for i in indices:
        key = _shape(windows[i], bos)
        if batch and (len(batch) == batch_size or _shape(windows[batch[0]], bos) != key):
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


def _shape(window: Window, bos: bool) -> tuple[int, int]:
    return window.end - window.start + bos, window.score_from - window.start + bos


def window_ids(docs: list[list[int]], window: Window, bos_id: int | None) -> list[int]:
    prefix = [] if bos_id is None else [bos_id]
    return prefix + docs[window.doc][window.start : window.end]


def score_windows(
    model,
    docs: list[list[int]],
    windows: list[Window],
    *,
    accelerator: Accelerator,
    bos_id: int | None = None,
    batch_size: int = 1,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    desc: str = "",
) -> list[tuple[int, float, int]]:
    """``(window index, summed NLL, tokens scored)`` of every window, on every process, in window order.

    Raises:
        `RuntimeError`: the gathered results do not cover each window exactly once.
    """
    bos = bos_id is not None
    with accelerator.split_between_processes(list(range(len(windows)))) as mine:
        records = []
        bar = tqdm(total=len(mine), desc=desc, unit="window", disable=not accelerator.is_local_main_process)
        for batch in _batches(mine, windows, bos, batch_size):
            ids = torch.tensor([window_ids(docs, windows[i], bos_id) for i in batch], device=accelerator.device)
            nll = window_nll(model, ids, _shape(windows[batch[0]], bos)[1], chunk_size).tolist()
            records += [(i, value, windows[i].scored) for i, value in zip(batch, nll, strict=True)]
            bar.update(len(batch))
        bar.close()
    gathered = sorted(gather_object(records))
    if [record[0] for record in gathered] != list(range(len(windows))):
        raise RuntimeError(f"Gathered {len(gathered)} window results for {len(windows)} windows.")
    return gathered


def run_perplexity(
    *,
    model_source: ModelSource,
    text_source: TextSource,
    methods: list[str],
    lengths: list[int],
    protocol: str,
    stride: int | None,
    bos: str,
    max_windows: int | None,
    batch_size: int,
    chunk_size: int,
    output: Path,
    note: str | None = None,
) -> dict[str, Any]:
    """Perplexity of every method at every length on the same windows; writes and returns the record.

    Everything that can be wrong with the arguments is checked before the model is loaded, and then
    nothing is written: method specs (and methods given twice), the output folder (a folder that can
    be written; results of other arguments are refused), the data and every length. (method, length)
    pairs already in ``output`` are kept and not recomputed.
    """
    check_protocol(protocol, stride)
    methods = normalize_methods(methods)
    check_output(output)
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    arguments = {
        "model": model_source.name,
        "gguf_file": model_source.gguf_file,
        "dtype": model_source.resolved_dtype(accelerator.device),
        "dataset": text_source.describe(),
        "protocol": protocol,
        "stride": stride,
        "bos": bos,
        "max_windows": max_windows,
    }
    previous = load_previous(output / RESULTS_JSON, arguments)
    results = previous["results"] if previous else []
    refuse_duplicates(methods, [r["method"] for r in results], output / RESULTS_JSON)

    tokenizer = load_tokenizer(model_source)
    bos_id = resolve_bos(bos, tokenizer)
    with accelerator.main_process_first():
        docs = tokenize_texts(tokenizer, load_texts(text_source))
    doc_lengths = [len(d) for d in docs]
    data_details = {
        **text_source.describe(),
        "local": text_source.local is not None,
        "documents": len(docs),
        "tokens": sum(doc_lengths),
    }
    if previous and _counts(previous["dataset_details"]) != _counts(data_details):  # same arguments, new data
        raise ValueError(
            f"The results in {output / RESULTS_JSON} were computed on other data: "
            f"{_counts(previous['dataset_details'])} then, {_counts(data_details)} now. Choose another --output folder."
        )
    plans = {
        n: build_windows(doc_lengths, n, protocol, bos=bos_id is not None, stride=stride, max_windows=max_windows)
        for n in lengths
    }
    done = {(r["method"], r["length"]) for r in results}
    todo = {spec: [n for n in lengths if (spec, n) not in done] for spec in methods}
    if not any(todo.values()):
        record = {**previous, "results": sort_results(results, methods)}
        if accelerator.is_main_process:
            write_all(output, record)
        return record

    longest = max(_shape(w, bos_id is not None)[0] for n in set().union(*todo.values()) for w in plans[n].windows)
    model, resolved = _load_checked(model_source, methods, accelerator, max(docs, key=len), longest)
    written = {row["method"]: row.get("params") or {} for row in results}
    refuse_duplicates(
        methods,
        list(written),
        output / RESULTS_JSON,
        identity=lambda spec: resolved_identity(spec, resolved[spec] if spec in resolved else written[spec]),
    )
    record = {
        "protocol": protocol,
        "model": model_source.label,
        "dataset": text_source.label,
        "versions": versions(),
        "protocol_details": {
            "stride": (stride or "half the length") if protocol == "sliding" else None,
            "bos": bos_id is not None,
            "mean": "token-weighted over scored tokens",
            "note": note,
        },
        "model_details": {
            "name": model_source.name,
            "gguf_file": model_source.gguf_file,
            "dtype": arguments["dtype"],
            "trained_context": trained_context(model.config),
        },
        "dataset_details": data_details,
        "processes": accelerator.num_processes,
        "device": device_description(accelerator.device),
        "arguments": arguments,
        "results": results,
    }
    for spec, spec_lengths in todo.items():
        if not spec_lengths:
            continue
        with applied(model, spec, quiet=True) as params:
            for n in spec_lengths:
                start = time.perf_counter()
                scored = score_windows(
                    model,
                    docs,
                    plans[n].windows,
                    accelerator=accelerator,
                    bos_id=bos_id,
                    batch_size=batch_size,
                    chunk_size=chunk_size,
                    desc=f"{spec} @ {n}",
                )
                seconds = time.perf_counter() - start
                results.append(_result(spec, params, n, scored, plans[n], seconds))
                record["results"] = sort_results(results, methods)
                if accelerator.is_main_process:
                    write_all(output, record)
    return record


def _counts(details: dict[str, Any]) -> str:
    return f"{details['documents']} documents of {details['tokens']} tokens"


def _result(spec: str, params: dict, length: int, scored: list, plan: WindowPlan, seconds: float) -> dict:
    """One row of results.json: token-weighted NLL and PPL, and what was (not) scored."""
    tokens = sum(r[2] for r in scored)
    nll, ppl = perplexity(sum(r[1] for r in scored), tokens)
    if math.isnan(nll):
        logger.warning("%s @ %d: the loss is NaN, a numerical failure (float16 overflow?)", spec, length)
    return {
        "method": spec,
        "params": params,
        "length": length,
        "ppl": ppl,
        "nll": nll,
        "tokens": tokens,
        "windows": len(scored),
        "skipped_documents": plan.skipped_documents,
        "dropped_tokens": plan.dropped_tokens,
        "seconds": round(seconds, 2),
    }


def write_all(output: Path, record: dict[str, Any]) -> None:
    """results.json, results.csv and ppl_vs_length.png of ``record`` (each written atomically)."""
    write_json(output / RESULTS_JSON, record)
    write_csv(output / "results.csv", record["results"])
    details = record["protocol_details"]
    title = (
        f"{record['model']} on {record['dataset']}\nprotocol {record['protocol']}, "
        f"{'BOS prepended' if details['bos'] else 'no BOS'}, {record['model_details']['dtype']}"
    )
    plot_ppl_vs_length(
        output / "ppl_vs_length.png",
        record["results"],
        trained_context=record["model_details"]["trained_context"],
        title=title,
    )


def _map_split(accelerator: Accelerator, count: int, fn, desc: str) -> list:
    """``[fn(0), …, fn(count - 1)]``, the indices split across processes, gathered once, checked."""
    with accelerator.split_between_processes(list(range(count))) as mine:
        bar = tqdm(mine, desc=desc, unit="prompt", disable=not accelerator.is_local_main_process)
        records = [(i, fn(i)) for i in bar]
    gathered = sorted(gather_object(records))
    if [i for i, _ in gathered] != list(range(count)):
        raise RuntimeError(f"Gathered {len(gathered)} results for {count} items.")
    return [value for _, value in gathered]


def run_passkey(
    *,
    model_source: ModelSource,
    methods: list[str],
    lengths: list[int],
    depths: list[float],
    trials: int,
    seed: int,
    bos: str,
    output: Path,
) -> dict[str, Any]:
    """Passkey accuracy of every method by length and depth; writes passkey.json and the heatmap.

    The same keys (from ``seed``) are used at every length, depth and method. Method specs, the output
    folder and every length are checked before the model is loaded, and then nothing is written.
    Finished (method, length) pairs in ``output`` are kept and not recomputed.
    """
    methods = normalize_methods(methods)
    check_output(output)
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    arguments = {
        "model": model_source.name,
        "gguf_file": model_source.gguf_file,
        "dtype": model_source.resolved_dtype(accelerator.device),
        "depths": depths,
        "trials": trials,
        "seed": seed,
        "bos": bos,
    }
    previous = load_previous(output / PASSKEY_JSON, arguments)
    done_trials = previous["trials"] if previous else []
    refuse_duplicates(methods, list(dict.fromkeys(t["method"] for t in done_trials)), output / PASSKEY_JSON)
    tokenizer = load_tokenizer(model_source)
    bos_id = resolve_bos(bos, tokenizer)
    keys = random_keys(trials, seed)
    prompts = {n: [(d, build_prompt(tokenizer, n, d, k, bos_id)) for d in depths for k in keys] for n in lengths}
    done = {(t["method"], t["length"]) for t in done_trials}
    record = {
        "task": "passkey retrieval, greedy (teacher-forced): the key's tokens, then no further digit",
        "model": model_source.label,
        "model_details": {"name": model_source.name, "gguf_file": model_source.gguf_file, "dtype": arguments["dtype"]},
        "bos": bos_id is not None,
        "versions": versions(),
        "processes": accelerator.num_processes,
        "device": device_description(accelerator.device),
        "arguments": arguments,
    }
    model = None
    for spec in methods:
        todo = [n for n in lengths if (spec, n) not in done]
        if todo and model is None:
            longest = max(len(p.input_ids) for n in lengths for _, p in prompts[n])
            model, _ = _load_checked(model_source, methods, accelerator, prompts[todo[0]][0][1].input_ids, longest)
        if not todo:
            continue
        with applied(model, spec, quiet=True):
            for n in todo:
                flags = _passkey_flags(
                    model, tokenizer, [p for _, p in prompts[n]], accelerator, f"passkey {spec} @ {n}"
                )
                done_trials += [
                    {"method": spec, "length": n, "depth": d, "key": p.key, "correct": ok}
                    for (d, p), ok in zip(prompts[n], flags, strict=True)
                ]
                record |= {"trials": done_trials, "accuracy": accuracy_grid(done_trials)}
                if accelerator.is_main_process:
                    write_passkey(output, record)
    if accelerator.is_main_process and model is None:
        write_passkey(output, previous)
    return record if model is not None else previous


def _passkey_flags(model, tokenizer, prompts: list, accelerator: Accelerator, desc: str) -> list[bool]:
    """Whether each prompt is answered correctly (the key, then no further digit), prompts split across
    processes."""

    def correct(i: int) -> bool:
        ids = torch.tensor([prompts[i].input_ids], device=accelerator.device)
        matches, after = greedy_continuation(model, ids, prompts[i].answer_from)
        return bool(matches[0]) and ends_the_number(tokenizer, int(after[0]))

    return _map_split(accelerator, len(prompts), correct, desc)


def _load_checked(
    model_source: ModelSource, methods: list[str], accelerator: Accelerator, ids: list[int], longest: int
) -> tuple[Any, dict[str, dict[str, Any]]]:
    """Load the model, check the chunked head applies to it, and that every method patches it and takes
    inputs of ``longest`` tokens; returns the model and each method's parameters as resolved on it."""
    model = load_model(model_source, accelerator.device)
    check_head_decomposition(model, torch.tensor([ids[:16]], dtype=torch.long, device=accelerator.device))
    resolved = {}
    for spec in methods:  # what only the model can reject fails here, before any long forward; notes logged
        with applied(model, spec) as params:
            resolved[spec] = params
            check_position_table(model, spec, longest)
    return model, resolved


def check_position_table(model, spec: str, longest: int) -> None:
    """Raise ``ValueError`` if ``model`` (patched with ``spec``) looks positions up in a learned table (GPT-2's
    ``wpe``) with fewer rows than ``longest`` input tokens; RoPE and ALiBi take any length."""
    patch = get_patch(model)
    if positions_of(model).kind != "learned" or (patch is not None and patch.method == "alibi"):
        return
    rows = model.config.max_position_embeddings  # GPT-2's n_positions under transformers' common name
    if longest > rows:
        raise ValueError(
            f"--method {spec!r}: {type(model).__name__} has a learned table of {rows} positions, and the longest "
            f"input here has {longest} tokens. Evaluate it at lengths up to {rows} (runs with the same --output "
            "add up), or with a method that extends or replaces the table (pi:factor=..., alibi)."
        )


def write_passkey(output: Path, record: dict[str, Any]) -> None:
    """passkey.json, passkey.csv (accuracy by method, length and depth) and passkey_heatmap.png (each
    written atomically)."""
    write_json(output / PASSKEY_JSON, record)
    write_csv(output / "passkey.csv", record["accuracy"], fields=("method", "length", "depth", "accuracy", "trials"))
    plot_passkey_heatmap(
        output / "passkey_heatmap.png",
        record["accuracy"],
        title=f"passkey retrieval: {record['model']}",
    )
