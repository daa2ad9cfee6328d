"""The accelerate driver: perplexity and passkey runs of every method on the same windows and prompts.

Everything that can be wrong with the arguments is checked before the model is loaded (and then
nothing is written); what only the model can reject is checked after loading, before any long forward.
Results are written after every (method, length), or every method whose lengths share forwards (``truncate``),
so a killed run resumes where it stopped.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator

from ..fingerprint import model_fingerprint
from ..patching import get_patch
from ..saved import SavedPatch
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
from .models import (
    ModelSource,
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
from .results import (
    PASSKEY_FILES,
    PASSKEY_JSON,
    PERPLEXITY_FILES,
    RESULTS_JSON,
    device_description,
    sort_results,
    versions,
    write_passkey_results,
    write_perplexity_results,
)
from .resume import (
    SoleWriter,
    check_output,
    check_same_bos,
    check_same_data,
    check_same_model,
    check_same_prompts,
    document_hashes,
    load_previous,
    prompt_hashes,
    remove_stale_temporaries,
)
from .scoring import LengthScore, input_shape, passkey_flags, score_lengths, serves_every_length
from .specs import method_applied, notes_once, parse_methods, refuse_duplicates, warn_past_reach

logger = logging.getLogger("hf_posenc")


def load_checked(
    model_source: ModelSource,
    saved: SavedPatch | None,
    specs: list[MethodSpec],
    accelerator: Accelerator,
    ids: list[int],
    longest: int,
) -> tuple[Any, dict[str, dict[str, Any]], dict[str, Any]]:
    """Load the (base) model, check the chunked head applies to it, and that every method patches it and
    takes inputs of ``longest`` tokens; returns the model, each method's parameters as resolved on it, and what the
    results' ``model_details`` say of the model as loaded: its trained context, fingerprint
    (:func:`~hf_posenc.fingerprint.model_fingerprint`, which a resume compares) and Hub commit
    (:func:`~hf_posenc.eval.models.loaded_commit`, which a push compares). The notes of patching about
    what was not given (the trained context assumed) are logged here only: the run patches again from the
    resolved parameters."""
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
            with method_applied(model, spec, spec.params):
                resolved[spec.text] = {} if spec.unpatched else dict(get_patch(model).params)
                check_position_table(model, spec.text, longest)
                warn_past_reach(spec, resolved[spec.text], longest)
    return model, resolved, loaded


def run_perplexity(
    *,
    model_source: ModelSource,
    text_source: TextSource,
    methods: Sequence[str] | None,
    lengths: list[int],
    protocol: str,
    stride: int | None,
    bos: str,
    max_windows: int | None,
    batch_size: int,
    chunk_size: int,
    output: Path,
    note: str | None = None,
    derive_lengths: bool = True,
) -> dict[str, Any]:
    """Perplexity of every method at every length on the same windows; writes and returns the report.

    Method specs (and methods given twice; None: :func:`parse_methods`' default), the output folder (a
    folder that can be written; results of other arguments or data, and files of other runs, are refused),
    the data and every length are checked before the model is loaded. (method, length) pairs already in
    ``output`` are kept and not recomputed. ``truncate``: a method that does not depend on the input's length
    scores each document once, at the longest missing length it fits, and reads the shorter ones from that
    forward (``derive_lengths=False``: one forward per length).
    """
    check_protocol(protocol, stride)
    saved = model_source.saved_patch()
    specs = parse_methods(methods, saved)
    check_output(output, PERPLEXITY_FILES)
    check_output_outside(output, text_source)
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    check_placement(model_source, accelerator.num_processes)
    arguments = {
        "model": model_source.name,
        "gguf_file": model_source.gguf_file,
        "dtype": model_source.resolved_dtype(accelerator.device),
        **model_source.identity,
        "dataset": text_source.describe(),
        "protocol": protocol,
        "stride": stride,
        "bos": bos,
        "max_windows": max_windows,
    }
    report_file = SoleWriter(output / RESULTS_JSON)
    previous = load_previous(output / RESULTS_JSON, arguments, kind="perplexity")
    results = previous["results"] if previous else []
    refuse_duplicates(specs, [r["method"] for r in results], output / RESULTS_JSON)

    tokenizer = load_tokenizer(model_source, saved)
    bos_id = resolve_bos(bos, tokenizer)
    with accelerator.main_process_first():
        docs = tokenize_texts(tokenizer, load_texts(text_source))
    doc_lengths = [len(d) for d in docs]
    data_details = {
        **text_source.describe(),
        "local": text_source.local is not None,
        "documents": len(docs),
        "tokens": sum(doc_lengths),
        "document_hashes": document_hashes(docs),
    }
    if previous:  # same arguments: the same data, and BOS as before?
        check_same_data(previous["dataset_details"], data_details, output / RESULTS_JSON)
        check_same_bos(previous, bos, bos_id, output / RESULTS_JSON)
    plans = {
        n: build_windows(doc_lengths, n, protocol, bos=bos_id is not None, stride=stride, max_windows=max_windows)
        for n in lengths
    }
    done = {(r["method"], r["length"]) for r in results}
    todo = {spec.text: [n for n in lengths if (spec.text, n) not in done] for spec in specs}
    if accelerator.is_main_process:
        remove_stale_temporaries(output, PERPLEXITY_FILES)
    # loaded and compared even when every result is there: a model saved over its folder is refused, not shown stale
    loading = set().union(*todo.values()) or set(lengths)
    longest = max(input_shape(w, bos_id is not None)[0] for n in loading for w in plans[n].windows)
    model, resolved, loaded = load_checked(model_source, saved, specs, accelerator, max(docs, key=len), longest)
    details = {**model_details(model_source, saved, arguments["dtype"]), **loaded}
    if previous:
        check_same_model(previous["model_details"], details, output / RESULTS_JSON)
    if not any(todo.values()):
        report = {**previous, "results": sort_results(results, [spec.text for spec in specs])}
        if accelerator.is_main_process:
            report_file.write(write_perplexity_results, output, report)
        return report
    rows = {row["method"]: row.get("params") or {} for row in results}
    refuse_duplicates(specs, list(rows), output / RESULTS_JSON, resolved={**rows, **resolved})
    report = {
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
        "model_details": details,
        "dataset_details": data_details,
        "processes": accelerator.num_processes,
        "device": device_description(accelerator.device),
        "arguments": arguments,
        "results": results,
    }
    for spec in specs:
        if not todo[spec.text]:
            continue
        shared = derive_lengths and protocol == "truncate" and serves_every_length(model, spec.method)
        with method_applied(model, spec, resolved[spec.text]):
            for group in [todo[spec.text]] if shared else [[n] for n in todo[spec.text]]:
                scores = score_lengths(
                    model,
                    docs,
                    {n: plans[n].windows for n in group},
                    accelerator=accelerator,
                    bos_id=bos_id,
                    batch_size=batch_size,
                    chunk_size=chunk_size,
                    desc=f"{spec.text} @ {','.join(map(str, group))}",
                )
                results += [_result(spec.text, resolved[spec.text], n, scores[n], plans[n]) for n in group]
                report["results"] = sort_results(results, [spec.text for spec in specs])
                if accelerator.is_main_process:
                    report_file.write(write_perplexity_results, output, report)
    return report


def _result(method: str, params: dict, length: int, score: LengthScore, plan: WindowPlan) -> dict:
    """One row of results.json: token-weighted NLL and PPL, what was (not) scored, and how: ``forwards`` of the
    ``windows`` had a forward of their own, the others were read from the forwards of ``derived_from``."""
    tokens = sum(count for _, count in score.windows)
    nll, ppl = perplexity(sum(value for value, _ in score.windows), tokens)
    if math.isnan(nll):
        logger.warning("%s @ %d: the loss is NaN, a numerical failure (float16 overflow?)", method, length)
    return {
        "method": method,
        "params": params,
        "length": length,
        "ppl": ppl,
        "nll": nll,
        "tokens": tokens,
        "windows": len(score.windows),
        "documents": plan.documents,
        "skipped_documents": plan.skipped_documents,
        "dropped_tokens": plan.dropped_tokens,
        "forwards": score.forwards,
        "derived_from": score.derived_from,
        "seconds": round(score.seconds, 2),
    }


MAX_TRIALS = 10_000  # keys per (length, depth); each is a forward per method


def run_passkey(
    *,
    model_source: ModelSource,
    methods: Sequence[str] | None,
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
    if isinstance(trials, bool) or not isinstance(trials, int) or not 0 < trials <= MAX_TRIALS:
        raise ValueError(f"`trials` must be a whole number of keys from 1 to {MAX_TRIALS}, got {trials!r}.")
    saved = model_source.saved_patch()
    specs = parse_methods(methods, saved)
    check_output(output, PASSKEY_FILES)
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    check_placement(model_source, accelerator.num_processes)
    arguments = {
        "model": model_source.name,
        "gguf_file": model_source.gguf_file,
        "dtype": model_source.resolved_dtype(accelerator.device),
        **model_source.identity,
        "depths": depths,
        "trials": trials,
        "seed": seed,
        "bos": bos,
    }
    report_file = SoleWriter(output / PASSKEY_JSON)
    previous = load_previous(output / PASSKEY_JSON, arguments, kind="passkey")
    done_trials = previous["trials"] if previous else []
    refuse_duplicates(specs, list(dict.fromkeys(t["method"] for t in done_trials)), output / PASSKEY_JSON)
    tokenizer = load_tokenizer(model_source, saved)
    bos_id = resolve_bos(bos, tokenizer)
    keys = random_keys(trials, seed)
    prompts = {n: [(d, build_prompt(tokenizer, n, d, k, bos_id)) for d in depths for k in keys] for n in lengths}
    fingerprints = prompt_hashes({n: [p.input_ids for _, p in prompts[n]] for n in lengths})
    if previous:
        check_same_bos(previous, bos, bos_id, output / PASSKEY_JSON)
    earlier = previous.get("prompt_hashes") if previous else None
    check_same_prompts(earlier, fingerprints, output / PASSKEY_JSON)
    done = {(t["method"], t["length"]) for t in done_trials}
    report = {
        "task": "passkey retrieval, greedy (teacher-forced): the key's tokens, then no further digit",
        "model": model_source.label,
        "model_details": model_details(model_source, saved, arguments["dtype"]),
        "bos": bos_id is not None,
        "versions": versions(),
        "processes": accelerator.num_processes,
        "device": device_description(accelerator.device),
        "arguments": arguments,
        "prompt_hashes": {**(earlier or {}), **fingerprints},
    }
    if accelerator.is_main_process:
        remove_stale_temporaries(output, PASSKEY_FILES)
    # loaded and compared even when every result is there: a model saved over its folder is refused, not shown stale
    longest = max(len(p.input_ids) for n in lengths for _, p in prompts[n])
    model, resolved, loaded = load_checked(
        model_source, saved, specs, accelerator, prompts[lengths[0]][0][1].input_ids, longest
    )
    report["model_details"].update(loaded)
    if previous:
        check_same_model(previous.get("model_details") or {}, report["model_details"], output / PASSKEY_JSON)
    todo = {spec.text: [n for n in lengths if (spec.text, n) not in done] for spec in specs}
    if not any(todo.values()):
        if accelerator.is_main_process:
            report_file.write(write_passkey_results, output, previous)
        return previous
    for spec in specs:
        if not todo[spec.text]:
            continue
        with method_applied(model, spec, resolved[spec.text]):
            for n in todo[spec.text]:
                desc = f"passkey {spec.text} @ {n}"
                flags = passkey_flags(model, tokenizer, [p for _, p in prompts[n]], accelerator, desc)
                done_trials += [
                    {"method": spec.text, "length": n, "depth": d, "key": p.key, "correct": ok}
                    for (d, p), ok in zip(prompts[n], flags, strict=True)
                ]
                report |= {"trials": done_trials, "accuracy": accuracy_grid(done_trials)}
                if accelerator.is_main_process:
                    report_file.write(write_passkey_results, output, report)
    return report
