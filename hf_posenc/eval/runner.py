"""The accelerate driver: perplexity and passkey runs of every method on the same windows and prompts.

Everything that can be wrong with the arguments is checked before the model is loaded (and then
nothing is written); what only the model can reject is checked after loading, before any long forward.
Results are written after every (method, length), or every method whose lengths share forwards (``truncate``),
so a killed run resumes where it stopped.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from tqdm.auto import tqdm

from ..hub.fingerprint import model_fingerprint
from ..hub.saved import SavedPatch
from ..patching import dry_run, learned_table_rows
from ..reports.runs import PasskeyReport, PerplexityReport, PerplexityRow
from ..spec import MethodSpec
from .data import (
    TextSource,
    WindowPlan,
    build_windows,
    check_output_outside,
    check_protocol,
    load_texts,
    tokenize_texts,
)
from .defaults import DEFAULT_SEQUENCE_SLICE, MAX_TRIALS, check_sequence_slice
from .folder import PASSKEY, PERPLEXITY, ResultsFolder
from .models import (
    EvalModel,
    check_placement,
    check_position_table,
    input_device,
    load_model_at_commit,
    load_tokenizer,
    model_details,
    resolve_bos,
    trained_context,
)
from .passkey import accuracy_grid, build_prompt, random_keys
from .perplexity import check_head_decomposition, perplexity
from .position_wise import sequence_slices
from .results import device_description, sort_results, versions
from .resume import (
    check_same_bos,
    check_same_data,
    check_same_model,
    check_same_prompts,
    document_hashes,
    prompt_hashes,
)
from .scoring import LengthScore, input_shape, passkey_flags, score_lengths, serves_every_length
from .specs import method_applied, notes_once, parse_methods, refuse_duplicates, warn_past_reach

logger = logging.getLogger("hf_posenc")


def load_checked(
    model_source: EvalModel,
    saved: SavedPatch | None,
    specs: list[MethodSpec],
    accelerator: Accelerator,
    ids: list[int],
    longest: int,
) -> tuple[Any, dict[str, dict[str, Any]], dict[str, Any]]:
    """Load the (base) model, check the chunked head applies to it, and that every method patches it and
    takes inputs of ``longest`` tokens; returns the model, each method's parameters as resolved on it, and what the
    results' ``model_details`` say of the model as loaded: its trained context, fingerprint
    (:func:`~hf_posenc.hub.fingerprint.model_fingerprint`, which a resume compares) and Hub commit
    (:func:`~hf_posenc.eval.models.loaded_commit`, which a push compares). Each method is planned without being
    applied (:func:`~hf_posenc.patching.dry_run`); the notes of planning about what was not given (the trained
    context assumed) are logged here only: the run patches from the resolved parameters."""
    model, commit = load_model_at_commit(model_source, accelerator.device, saved)
    loaded = {
        "trained_context": trained_context(model.config),
        "fingerprint": model_fingerprint(model),
        "commit": commit,
    }
    check_head_decomposition(model, torch.tensor([ids[:16]], dtype=torch.long, device=input_device(model)))
    resolved = {}
    with notes_once():
        for spec in specs:
            planned = None if spec.unpatched else dry_run(model, spec)
            resolved[spec.text] = {} if planned is None else dict(planned.info.params)
            rows = learned_table_rows(model) if planned is None else planned.table_rows
            check_position_table(model, rows, spec.text, longest)
            warn_past_reach(spec, resolved[spec.text], longest)
    return model, resolved, loaded


@dataclass(frozen=True)
class PerplexityConfig:
    """What a perplexity run measures, and how (``hf-posenc eval``'s options).

    Attributes:
        lengths (`list[int]`): the context lengths, in tokens.
        methods (`list[str]`, *optional*): method specs (``"yarn:factor=4"``); None: :func:`parse_methods`' default.
        protocol (`str`, defaults to ``"truncate"``): ``truncate``, ``disjoint`` or ``sliding`` windows.
        stride (`int`, *optional*): the step of ``sliding`` windows (default: half the length).
        bos (`str`, defaults to ``"auto"``): ``auto``, ``prepend`` or ``none``.
        max_windows (`int`, *optional*): score only the first N windows per length.
        batch_size (`int`, defaults to 1): windows per forward.
        chunk_size (`int`, defaults to 2048): positions per output-head call.
        derive_lengths (`bool`, defaults to `True`): ``truncate`` reads shorter lengths from the longest forward of a
            method that does not depend on the input's length; False: one forward per length.
        note (`str`, *optional*): what the data is, for the report's ``protocol_details``.
        blocks (`int`, defaults to 1): above 1, each row also holds each window's NLL by that many contiguous
            blocks of its tokens (``blocks``), from which :mod:`hf_posenc.tuning` reads the spread of a mean.
        sequence_slice (`int`, defaults to 4096): positions per slice of the MLPs and norms of a longer window, which
            bounds their memory and gives the same numbers (:mod:`~hf_posenc.eval.position_wise`); 0: one call.
    """

    lengths: list[int]
    methods: Sequence[str] | None = None
    protocol: str = "truncate"
    stride: int | None = None
    bos: str = "auto"
    max_windows: int | None = None
    batch_size: int = 1
    chunk_size: int = 2048
    derive_lengths: bool = True
    note: str | None = None
    blocks: int = 1
    sequence_slice: int = DEFAULT_SEQUENCE_SLICE

    def __post_init__(self) -> None:
        if isinstance(self.blocks, bool) or not isinstance(self.blocks, int) or self.blocks < 1:
            raise ValueError(f"`blocks` must be a whole number >= 1, got {self.blocks!r}.")
        check_sequence_slice(self.sequence_slice)


@dataclass
class _Run:
    """A run under way: the loaded model and what every method is scored on, and where the report goes."""

    model: Any
    accelerator: Accelerator
    folder: ResultsFolder
    report: dict[str, Any]
    resolved: dict[str, dict[str, Any]]
    bos_id: int | None

    def save(self) -> None:
        if self.accelerator.is_main_process:
            self.folder.write(self.report)


def run_perplexity(
    model_source: EvalModel, text_source: TextSource, config: PerplexityConfig, output: Path
) -> PerplexityReport:
    """Perplexity of every method at every length on the same windows; writes ``results.json`` (and its CSV and
    plot) and returns what it holds.

    Method specs (and methods given twice), the output folder (a folder that can be written; results of other
    arguments or data, and files of other runs, are refused), the data and every length are checked before the
    model is loaded. (method, length) pairs already in ``output`` are kept and not recomputed. ``truncate``: a
    method that does not depend on the input's length scores each document once, at the longest missing length it
    fits, and reads the shorter ones from that forward.

    Args:
        model_source (`ModelSource` or `LoadedModel`): the model, and how to load it (or the model in memory).
        text_source (`TextSource`): the documents.
        config (`PerplexityConfig`): lengths, methods and protocol.
        output (`Path`): the results folder (``results.json``, ``results.csv``, ``ppl_vs_length.png``).
    """
    check_protocol(config.protocol, config.stride, config.lengths, bos=config.bos == "prepend")
    saved = model_source.saved_patch()
    specs = parse_methods(config.methods, saved)
    folder = ResultsFolder(output, PERPLEXITY)
    folder.check()
    check_output_outside(output, text_source)
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    check_placement(model_source, accelerator.num_processes)
    arguments = _perplexity_arguments(model_source, text_source, config, accelerator.device)
    previous = folder.previous(arguments)
    results = previous["results"] if previous else []
    refuse_duplicates(specs, [r["method"] for r in results], folder.report_path)
    tokenizer = load_tokenizer(model_source, saved)
    bos_id = resolve_bos(config.bos, tokenizer)
    check_protocol(config.protocol, config.stride, config.lengths, bos=bos_id is not None)  # bos auto: its tokenizer's
    docs, data_details = _documents(tokenizer, text_source, accelerator)
    if previous:  # same arguments: the same data, and BOS as before?
        check_same_data(previous["dataset_details"], data_details, folder.report_path)
        check_same_bos(previous, config.bos, bos_id, folder.report_path)
    doc_lengths = [len(d) for d in docs]
    plans = {n: _windows(doc_lengths, n, config, bos_id is not None) for n in config.lengths}
    done = {(r["method"], r["length"]) for r in results}
    todo = {spec.text: [n for n in config.lengths if (spec.text, n) not in done] for spec in specs}
    if accelerator.is_main_process:
        folder.clean()
    # loaded and compared even when every result is there: a model saved over its folder is refused, not shown stale
    loading = set().union(*todo.values()) or set(config.lengths)
    longest = max(input_shape(w, bos_id is not None)[0] for n in loading for w in plans[n].windows)
    model, resolved, loaded = load_checked(model_source, saved, specs, accelerator, max(docs, key=len), longest)
    details = {**model_details(model_source, saved, arguments["dtype"]), **loaded}
    if previous:
        check_same_model(previous["model_details"], details, folder.report_path)
    order = [spec.text for spec in specs]
    if any(todo.values()):
        rows = {row["method"]: row.get("params") or {} for row in results}
        refuse_duplicates(specs, list(rows), folder.report_path, resolved={**rows, **resolved})
        report = _perplexity_report(model_source, text_source, config, bos_id)
        report |= {"model_details": details, "dataset_details": data_details, "processes": accelerator.num_processes}
        report |= {"device": device_description(accelerator.device), "arguments": arguments, "results": results}
    else:
        report = {**previous, "results": sort_results(results, order)}
    run = _Run(model, accelerator, folder, report, resolved, bos_id)
    if not any(todo.values()):
        run.save()
    for spec in _pending(specs, todo, accelerator):
        _score_method(run, spec, todo[spec.text], docs, plans, config, order)
    return PerplexityReport.from_json(run.report)


def check_perplexity_output(
    model_source: EvalModel, text_source: TextSource, config: PerplexityConfig, output: Path
) -> None:
    """What :func:`run_perplexity` refuses of ``output`` before it reads anything but configs: a folder it cannot
    write, one inside the data, and one holding results of other arguments. For a caller that runs other work
    first (a tune's screening)."""
    folder = ResultsFolder(output, PERPLEXITY)
    folder.check()
    check_output_outside(output, text_source)
    device = Accelerator(cpu=not torch.cuda.is_available()).device
    folder.previous(_perplexity_arguments(model_source, text_source, config, device))


def _pending(specs: list[MethodSpec], todo: dict[str, list[int]], accelerator: Accelerator) -> Iterator[MethodSpec]:
    """The methods with lengths left to score, in order, counted by a bar of their own (with the time left) where
    there are several."""
    pending = [spec for spec in specs if todo[spec.text]]
    shown = accelerator.is_local_main_process and len(pending) > 1
    yield from tqdm(pending, desc="methods", unit="method", disable=not shown)


def _perplexity_arguments(
    model_source: EvalModel, text_source: TextSource, config: PerplexityConfig, device: torch.device
) -> dict[str, Any]:
    """What a results file's ``arguments`` hold: the inputs that decide its numbers, which a resume compares."""
    return {
        "model": model_source.name,
        "gguf_file": model_source.gguf_file,
        "dtype": model_source.resolved_dtype(device),
        **model_source.identity,
        "dataset": text_source.describe(),
        "protocol": config.protocol,
        "stride": config.stride,
        "bos": config.bos,
        "max_windows": config.max_windows,
        **({"blocks": config.blocks} if config.blocks > 1 else {}),
    }


def _documents(tokenizer: Any, text_source: TextSource, accelerator: Accelerator) -> tuple[list[list[int]], dict]:
    """The documents' token ids (read and tokenized by the main process first: one download and cache) and what the
    results' ``dataset_details`` say of them."""
    with accelerator.main_process_first():
        docs = tokenize_texts(tokenizer, load_texts(text_source))
    details = {
        **text_source.describe(),
        "local": not text_source.on_hub,  # local files or texts in memory: no Hub dataset for a card to name
        "documents": len(docs),
        "tokens": sum(len(d) for d in docs),
        "document_hashes": document_hashes(docs),
    }
    return docs, details


def _windows(doc_lengths: list[int], length: int, config: PerplexityConfig, bos: bool) -> WindowPlan:
    return build_windows(
        doc_lengths, length, config.protocol, bos=bos, stride=config.stride, max_windows=config.max_windows
    )


def _perplexity_report(
    model_source: EvalModel, text_source: TextSource, config: PerplexityConfig, bos_id: int | None
) -> dict[str, Any]:
    """A new results file's first fields: what was measured, on what, and how."""
    return {
        "protocol": config.protocol,
        "model": model_source.label,
        "dataset": text_source.label,
        "versions": versions(),
        "protocol_details": {
            "stride": (config.stride or "half the length") if config.protocol == "sliding" else None,
            "bos": bos_id is not None,
            "mean": "token-weighted over scored tokens",
            "note": config.note,
        },
    }


def _score_method(
    run: _Run,
    spec: MethodSpec,
    lengths: list[int],
    docs: list[list[int]],
    plans: dict[int, WindowPlan],
    config: PerplexityConfig,
    order: list[str],
) -> None:
    """Score ``spec`` at ``lengths``, writing the report after each forward group: every length from one forward
    where the method serves them all (``truncate``), else one length at a time."""
    shared = config.derive_lengths and config.protocol == "truncate" and serves_every_length(run.model, spec.method)
    params = run.resolved[spec.text]
    with method_applied(run.model, spec, params), sequence_slices(run.model, config.sequence_slice):
        for group in [lengths] if shared else [[n] for n in lengths]:
            scores = score_lengths(
                run.model,
                docs,
                {n: plans[n].windows for n in group},
                accelerator=run.accelerator,
                bos_id=run.bos_id,
                batch_size=config.batch_size,
                chunk_size=config.chunk_size,
                desc=f"{spec.text} @ {','.join(map(str, group))}",
                blocks=config.blocks,
            )
            rows = [*run.report["results"], *(_result(spec.text, params, n, scores[n], plans[n]) for n in group)]
            run.report["results"] = sort_results(rows, order)
            run.save()


def _result(method: str, params: dict, length: int, score: LengthScore, plan: WindowPlan) -> dict[str, Any]:
    """One row of results.json: token-weighted NLL and PPL, what was (not) scored, and how: ``forwards`` of the
    ``windows`` had a forward of their own, the others were read from the forwards of ``derived_from``."""
    tokens = sum(count for _, count in score.windows)
    nll, ppl = perplexity(sum(value for value, _ in score.windows), tokens)
    if math.isnan(nll):
        logger.warning("%s @ %d: the loss is NaN, a numerical failure (float16 overflow?)", method, length)
    row = PerplexityRow(
        method=method,
        params=params,
        length=length,
        ppl=ppl,
        nll=nll,
        tokens=tokens,
        windows=len(score.windows),
        documents=plan.documents,
        skipped_documents=plan.skipped_documents,
        dropped_tokens=plan.dropped_tokens,
        forwards=score.forwards,
        derived_from=score.derived_from,
        seconds=round(score.seconds, 2),
        blocks=None if score.blocks is None else [[value, count] for value, count in score.blocks],
    )
    return row.to_json()


@dataclass(frozen=True)
class PasskeyConfig:
    """What a passkey run measures (``hf-posenc passkey``'s options).

    Attributes:
        lengths (`list[int]`): prompt lengths, in tokens.
        methods (`list[str]`, *optional*): method specs; None: :func:`parse_methods`' default.
        depths (`list[float]`, defaults to ``[0, 0.5, 1]``): where the key is hidden (0 = start, 1 = end).
        trials (`int`, defaults to 1): keys per length and depth, at most ``MAX_TRIALS``.
        seed (`int`, defaults to 0): the seed of the keys.
        bos (`str`, defaults to ``"auto"``): ``auto``, ``prepend`` or ``none``.
        sequence_slice (`int`, defaults to 4096): positions per slice of the MLPs and norms of a longer prompt (as
            :class:`PerplexityConfig`'s); 0: one call.
    """

    lengths: list[int]
    methods: Sequence[str] | None = None
    depths: list[float] = field(default_factory=lambda: [0.0, 0.5, 1.0])
    trials: int = 1
    seed: int = 0
    bos: str = "auto"
    sequence_slice: int = DEFAULT_SEQUENCE_SLICE

    def __post_init__(self) -> None:
        trials = self.trials
        if isinstance(trials, bool) or not isinstance(trials, int) or not 0 < trials <= MAX_TRIALS:
            raise ValueError(f"`trials` must be a whole number of keys from 1 to {MAX_TRIALS}, got {trials!r}.")
        check_sequence_slice(self.sequence_slice)


def run_passkey(model_source: EvalModel, config: PasskeyConfig, output: Path) -> PasskeyReport:
    """Passkey accuracy of every method by length and depth; writes passkey.json and the heatmap, and returns what
    passkey.json holds.

    The same keys (from ``seed``) are used at every length, depth and method. Method specs, the output
    folder and every length are checked before the model is loaded, and then nothing is written.
    Finished (method, length) pairs in ``output`` are kept and not recomputed.

    Args:
        model_source (`ModelSource` or `LoadedModel`): the model, and how to load it (or the model in memory).
        config (`PasskeyConfig`): lengths, depths, keys and methods.
        output (`Path`): the results folder (``passkey.json``, ``passkey.csv``, the heatmap).
    """
    saved = model_source.saved_patch()
    specs = parse_methods(config.methods, saved)
    folder = ResultsFolder(output, PASSKEY)
    folder.check()
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    check_placement(model_source, accelerator.num_processes)
    dtype = model_source.resolved_dtype(accelerator.device)
    arguments = _passkey_arguments(model_source, config, dtype)
    previous = folder.previous(arguments)
    done_trials = previous["trials"] if previous else []
    refuse_duplicates(specs, list(dict.fromkeys(t["method"] for t in done_trials)), folder.report_path)
    tokenizer = load_tokenizer(model_source, saved)
    bos_id = resolve_bos(config.bos, tokenizer)
    keys = random_keys(config.trials, config.seed)
    prompts = {
        n: [(d, build_prompt(tokenizer, n, d, k, bos_id)) for d in config.depths for k in keys] for n in config.lengths
    }
    fingerprints = prompt_hashes({n: [p.input_ids for _, p in prompts[n]] for n in config.lengths})
    if previous:
        check_same_bos(previous, config.bos, bos_id, folder.report_path)
    earlier = previous.get("prompt_hashes") if previous else None
    check_same_prompts(earlier, fingerprints, folder.report_path)
    report = {
        "task": "passkey retrieval, greedy (teacher-forced): the key's tokens, then no further digit",
        "model": model_source.label,
        "model_details": model_details(model_source, saved, dtype),
        "bos": bos_id is not None,
        "versions": versions(),
        "processes": accelerator.num_processes,
        "device": device_description(accelerator.device),
        "arguments": arguments,
        "prompt_hashes": {**(earlier or {}), **fingerprints},
    }
    if accelerator.is_main_process:
        folder.clean()
    # loaded and compared even when every result is there: a model saved over its folder is refused, not shown stale
    longest = max(len(p.input_ids) for n in config.lengths for _, p in prompts[n])
    first = prompts[config.lengths[0]][0][1].input_ids
    model, resolved, loaded = load_checked(model_source, saved, specs, accelerator, first, longest)
    report["model_details"].update(loaded)
    if previous:
        check_same_model(previous.get("model_details") or {}, report["model_details"], folder.report_path)
    done = {(t["method"], t["length"]) for t in done_trials}
    todo = {spec.text: [n for n in config.lengths if (spec.text, n) not in done] for spec in specs}
    run = _Run(model, accelerator, folder, report, resolved, bos_id)
    if not any(todo.values()):
        run.report = previous
        run.save()
    for spec in _pending(specs, todo, accelerator):
        _passkey_trials(run, spec, {n: prompts[n] for n in todo[spec.text]}, tokenizer, done_trials, config)
    return PasskeyReport.from_json(run.report)


def _passkey_arguments(model_source: EvalModel, config: PasskeyConfig, dtype: str) -> dict[str, Any]:
    """What a passkey.json's ``arguments`` hold: the inputs that decide its numbers, which a resume compares."""
    arguments = {"model": model_source.name, "gguf_file": model_source.gguf_file, "dtype": dtype}
    arguments |= {**model_source.identity, "depths": config.depths, "trials": config.trials}
    return arguments | {"seed": config.seed, "bos": config.bos}


def check_passkey_output(model_source: EvalModel, config: PasskeyConfig, output: Path) -> None:
    """What :func:`run_passkey` refuses of ``output`` before it reads anything but configs: a folder it cannot
    write, and one holding results of other arguments. For a caller that runs other work first (a tune)."""
    folder = ResultsFolder(output, PASSKEY)
    folder.check()
    device = Accelerator(cpu=not torch.cuda.is_available()).device
    folder.previous(_passkey_arguments(model_source, config, model_source.resolved_dtype(device)))


def _passkey_trials(
    run: _Run,
    spec: MethodSpec,
    prompts: dict[int, list],
    tokenizer: Any,
    done_trials: list[dict[str, Any]],
    config: PasskeyConfig,
) -> None:
    """Every trial of ``spec`` at the lengths of ``prompts``, the report written after each length."""
    with method_applied(run.model, spec, run.resolved[spec.text]), sequence_slices(run.model, config.sequence_slice):
        for n, trials in prompts.items():
            desc = f"passkey {spec.text} @ {n}"
            flags = passkey_flags(run.model, tokenizer, [p for _, p in trials], run.accelerator, desc)
            done_trials += [
                {"method": spec.text, "length": n, "depth": d, "key": p.key, "correct": ok}
                for (d, p), ok in zip(trials, flags, strict=True)
            ]
            run.report |= {"trials": done_trials, "accuracy": accuracy_grid(done_trials)}
            run.save()
