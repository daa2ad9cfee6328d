"""``hf-posenc check CONFIG_OR_REPO``: whether vLLM, SGLang, llama.cpp and TGI build a saved config as transformers
5 does (:mod:`hf_posenc.serving.engines`), from the raw ``config.json`` alone (no model, no remote code)."""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from huggingface_hub import hf_hub_download

from .._version import __version__
from ..hub.errors import HubError, call_hub, refuse_missing_folder
from ..hub.metadata import read_metadata
from ..hub.reach import CONFIG_FILE, cached_file, hub_unreachable
from ..record import PatchRecord
from ..registry import Method, get_method
from ..serving.engines import (
    ENGINES,
    REFERENCE_READS,
    Finding,
    View,
    config_rotary_dim,
    engine_findings,
    lookalike_notes,
    rope_view,
)

_REPO_ID = re.compile(r"[\w.-]+(/[\w.-]+)?")

EPILOG = f"""\
For each engine, from what its source reads (hf_posenc/serving/engines.py names the files and versions): ok (built as
transformers 5 builds it), differs (built otherwise: the detail gives both values), refused (the engine raises),
ignored (built without the method: plain RoPE). A 'config' line flags keys other readers take otherwise
(rope_scaling against rope_parameters, the top-level rope_theta); a 'record' line, an hf_posenc record that says
another method than the config's RoPE keys. Engines: {", ".join(e.name for e in ENGINES)}.

Exit status: 0 when every engine builds it as transformers does, 1 when one does not, 2 when the config cannot be
read (no such file, folder without config.json, Hub failure, not a JSON object).

examples:
  hf-posenc check qwen-yarn4/
  hf-posenc check qwen-yarn4/config.json --json
  hf-posenc check me/Qwen2.5-0.5B-yarn-x4 --revision main
"""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``check``; its ``func`` is :func:`check_command`."""
    check = subparsers.add_parser(
        "check",
        help="say whether serving engines (vLLM, SGLang, llama.cpp, TGI) build a saved config as transformers does",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    check.add_argument("config", metavar="CONFIG_OR_REPO", help="a config.json, a folder holding one, or a Hub id")
    check.add_argument("--revision", help="branch, tag or commit of a Hub repo (default: main)")
    check.add_argument("--json", action="store_true", help="print the findings as JSON instead of a table")
    check.set_defaults(func=check_command)


def check_command(args: argparse.Namespace) -> int:
    """Print the findings for ``args.config`` (a table, or JSON with ``--json``); the exit status: 0 or 1."""
    config = read_config(args.config, args.revision)
    where = config_label(args.config)
    with _malformed_rope_keys(where):
        _check_rope_values(config)
        _check_bounds(config)
    check_model_type(config, where)
    record = PatchRecord.from_config(config, missing_ok=True)
    added = _weights_hold_added_tensors(args.config, args.revision, record)
    with _malformed_rope_keys(where):
        _check_transformers_reads(config)
        findings = [*record_findings(config, record), *engine_findings(config, added_tensors=added)]
    status = 0 if all(finding.severity == "ok" for finding in findings) else 1
    unknown = None if record is None else _unknown_here(record)
    notes = [] if record is None or unknown else lookalike_notes(record.method)
    if args.json:
        method = None if record is None else {"method": record.method, "native": record.native}
        method = method and {**method, "version": record.version, "known": unknown is None}
        report = {
            "config": args.config,
            "revision": args.revision,
            "hf_posenc": method,
            "findings": [vars(finding) for finding in findings],
            "notes": [{"engine": engine, "note": note} for engine, note in notes],
            "engines": {engine.name: engine.version for engine in ENGINES},
            "exit_status": status,
        }
        print(json.dumps(report, indent=2))
        return status
    own_type = "" if record is None or record.native else " (hf_posenc's own rope type: load it with hf_posenc)"
    note = f" ({unknown})" if unknown else own_type
    print(f"{args.config}: hf_posenc record: {'none' if record is None else record.method}{note}")
    print(format_findings(findings))
    for engine, note in notes:
        print(f"note: {engine}: {note}.")
    return status


@contextlib.contextmanager
def _malformed_rope_keys(where: str) -> Iterator[None]:
    """What the block raises on a RoPE value (of the wrong type, out of bounds, refused by transformers) as one
    ``ValueError`` naming the file."""
    try:
        yield
    except (TypeError, ValueError, KeyError, ArithmeticError) as error:
        detail = str(error) if isinstance(error, TransformersRefuses) else f"{type(error).__name__}: {error}"
        raise ValueError(f"{where}: its RoPE keys are malformed ({detail}).") from None


def config_label(source: str) -> str:
    """The config file ``source`` names, for messages: the file, a folder's ``config.json``, a Hub repo's."""
    path = Path(source)
    if path.is_dir() or not path.exists():
        return f"{source.rstrip('/')}/{CONFIG_FILE}"
    return source


_MISTRAL_KEYS = {"dim", "n_layers", "n_heads"}  # Mistral's own params.json (vLLM: --config-format mistral)


def check_model_type(config: dict[str, Any], where: str) -> None:
    """Raise ``ValueError`` naming ``where`` unless ``config`` is a transformers config of a model type transformers
    knows: every verdict compares an engine with what transformers builds, and the engines that load configs
    through transformers (vLLM, SGLang) find the model class by that type."""
    from transformers import __version__ as transformers_version
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = config.get("model_type")
    if model_type is None:
        other = " (it is Mistral's own params.json format)" if config.keys() >= _MISTRAL_KEYS else ""
        raise ValueError(
            f"{where} is not a transformers config: it has no model_type key{other}. check reads the config.json that "
            "transformers, vLLM, SGLang, TGI and llama.cpp's converter read."
        )
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise ValueError(
            f"{where}: model_type {model_type!r} is unknown to transformers {transformers_version}, so no verdict can "
            "compare an engine with what transformers builds from it."
        )


def _unknown_here(record: PatchRecord) -> str | None:
    """What to say of a record this hf_posenc cannot read (a newer version's method or parameter, a typo): its method
    unknown, or its parameters not building it; None when they build it."""
    written = f"the record was written by hf_posenc {record.version}" if record.version else "the record has no version"
    try:
        method = get_method(record.method)
    except ValueError as error:
        return f"unknown to this hf_posenc {__version__}; {written}. {error}"
    try:
        method.make_params(**record.params)
    except (TypeError, ValueError) as error:
        return f"its parameters do not build it in this hf_posenc {__version__}; {written}. {error}"
    return None


def record_findings(config: dict[str, Any], record: PatchRecord | None) -> list[Finding]:
    """A ``record`` finding where the config's RoPE keys (as transformers 5 reads them) say another method than its
    hf_posenc record; none where they agree, the record's method is unknown here, or the config has no RoPE keys."""
    view = rope_view(config, REFERENCE_READS)
    if record is None or _unknown_here(record) or view.source == "none" and "rope_theta" not in config:
        return []
    method = get_method(record.method)
    gap = _native_gap(config, record, method, view) if record.native else _own_gap(record, view)
    if gap is None:
        return []
    readers = "hf_posenc's loading and the card go by the record, transformers and the engines by the config"
    return [Finding("record", "differs", f"the hf_posenc record says {record.method}; {gap}: {readers}")]


def _native_gap(config: dict[str, Any], record: PatchRecord, method: Method, view: View) -> str | None:
    """Where the config departs from the record's method in transformers' vocabulary: another rope type, or a
    value of that form the config's dict holds too (``rope_theta`` aside: static NTK's depends on the base)."""
    dim = config_rotary_dim(config, view)
    if method.transformers_rope is None or dim is None:
        return None
    form = method.transformers_rope(method.make_params(**record.params), dim, view.theta)
    if form is None:
        return None
    if view.rope_type != form["rope_type"]:
        return f"{view.source} says rope type {view.rope_type!r}, where {record.method}'s is {form['rope_type']!r}"
    shared = (form.keys() & view.params.keys()) - {"rope_theta"}
    differ = sorted(key for key in shared if not _alike(form[key], view.params[key]))
    values = (f"{key} {view.params[key]!r} where the record has {form[key]!r}" for key in differ)
    return f"{view.source} has {', '.join(values)}" if differ else None


def _own_gap(record: PatchRecord, view: View) -> str | None:
    """A record of hf_posenc's own rope types whose config says a rope type of transformers', or names another
    method."""
    from ..patching.rope_types import OWN_ROPE_TYPES

    if view.rope_type not in OWN_ROPE_TYPES:
        return f"{view.source} says rope type {view.rope_type!r}, where the record says hf_posenc's own rope type"
    named = view.params.get("method", record.method)
    return None if named == record.method else f"{view.source} names method {named!r}"


def _alike(a: Any, b: Any) -> bool:
    """Equal, numbers to float rounding (lists item by item)."""
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_alike(x, y) for x, y in zip(a, b, strict=True))
    numbers = all(isinstance(x, int | float) and not isinstance(x, bool) for x in (a, b))
    return math.isclose(a, b, rel_tol=1e-9) if numbers else a == b


_FRACTIONS = ("partial_rotary_factor", "attention_factor")  # read as numbers by every engine that reads them
# the values with an upper bound besides > 0: name -> (bound, what the value is)
_BOUNDED = {"partial_rotary_factor": (1, "the fraction of each head that RoPE rotates")}


def _check_rope_values(config: dict[str, Any]) -> None:
    """``rope_scaling`` / ``rope_parameters`` objects or null; their numbers (and the sizes and fractions read)
    finite and > 0."""
    for key in ("rope_scaling", "rope_parameters"):
        rope = config.get(key)
        if rope is not None and not isinstance(rope, dict):
            raise TypeError(f"{key} is a {type(rope).__name__}, not an object")
        entries = rope if rope and "full_attention" in rope else {key: rope} if rope else {}  # per layer type
        for layer_type, entry in entries.items():
            if not isinstance(entry, dict):
                raise TypeError(f"{key}.{layer_type} is a {type(entry).__name__}, not an object (one per layer type)")
            for name in ("factor", "rope_theta", "original_max_position_embeddings", *_FRACTIONS):
                _positive(f"{key}.{name}", entry.get(name), *_BOUNDED.get(name, ()))
    for name in (
        "rope_theta",
        "max_position_embeddings",
        "num_attention_heads",
        "hidden_size",
        "head_dim",
        *_FRACTIONS,
    ):
        _positive(name, config.get(name), *_BOUNDED.get(name, ()))


_SCALED_TYPES = ("linear", "dynamic", "yarn", "longrope", "llama3")  # their factor is s = L'/L


def _check_bounds(config: dict[str, Any]) -> None:
    """The bounds ``patch`` applies to the values transformers reads (:func:`~hf_posenc.methods._common.scale_factor`:
    a factor in ``[1, 2^24]``; LongRoPE's lists one value per rotary pair)."""
    from ..methods._common import scale_factor

    view = rope_view(config, REFERENCE_READS)
    if view.rope_type in _SCALED_TYPES and "factor" in view.params:
        scale_factor(view.params["factor"], f"{view.source}.factor")
    dim = config_rotary_dim(config, view)
    for name in ("long_factor", "short_factor") if view.rope_type == "longrope" else ():
        values = view.params.get(name)
        if values is not None and (not isinstance(values, list) or dim is None or len(values) != dim // 2):
            size = len(values) if isinstance(values, list) else type(values).__name__
            raise ValueError(f"{view.source}.{name} holds {size} values, not one per rotary pair ({dim} // 2)")


class TransformersRefuses(ValueError):
    """transformers' config class raises on the config's RoPE keys."""


def _check_transformers_reads(config: dict[str, Any]) -> None:
    """Raise what transformers 5 raises building ``config`` (its config class validates the RoPE keys: a yarn
    without ``factor``, a llama3 without its frequency factors), for a model type and rope type it knows; the
    engines' verdicts compare with what transformers builds, so there is nothing to compare with otherwise (the model
    type is known: :func:`check_model_type`)."""
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.utils import logging as transformers_logging

    rope_type = rope_view(config, REFERENCE_READS).rope_type
    if rope_type not in ("default", *ROPE_INIT_FUNCTIONS):
        return
    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()  # its warnings on odd values: the verdicts say what matters
    try:
        AutoConfig.for_model(**copy.deepcopy(config))  # it standardizes the RoPE dicts in place
    except Exception as error:  # whatever its validators raise (huggingface_hub's strict dataclass errors too)
        cause = error.__cause__ or error
        lines = [line.strip() for line in f"{type(cause).__name__}: {cause}".splitlines() if line.strip()]
        raise TransformersRefuses(f"transformers refuses them: {' '.join(lines)}") from None
    finally:
        transformers_logging.set_verbosity(verbosity)


def _positive(name: str, value: Any, most: float = math.inf, what: str = "") -> None:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if value is not None and not (number and 0 < value < math.inf):  # NaN fails the comparison too
        raise ValueError(f"{name} is {value!r}, not a finite number > 0")
    if value is not None and value > most:
        raise ValueError(f"{name} is {value!r}, more than {most} ({what})")


def format_findings(findings: list[Finding]) -> str:
    """``engine | read from | verdict | detail`` rows, the columns aligned: ``read from`` is the engine's release whose
    source the verdict was read from."""
    head = ("engine", "read from", "verdict", "detail")
    rows = [head, *((f.engine, f.release or "-", f.severity, f.message) for f in findings)]
    widths = [max(len(row[column]) for row in rows) for column in range(3)]
    lines = (
        " | ".join([*(cell.ljust(width) for cell, width in zip(row[:3], widths, strict=True)), row[3]]) for row in rows
    )
    return "\n".join(lines)


def _weights_hold_added_tensors(source: str, revision: str | None, record: PatchRecord | None) -> bool:
    """Whether ``source``'s weights hold tensors its patch added: a method that adds some (the T5 table), and
    weights beside the config (its ``hf_posenc.json`` says so; a folder without one: weight files there; a Hub
    repo without one holds its own)."""
    try:
        adds = record is not None and get_method(record.method).adds_parameters
    except ValueError:  # a method this version does not know: its findings say what the engines make of it
        return False
    if not adds:
        return False
    path = Path(source)
    folder = path.parent if path.is_file() else path
    metadata = read_metadata(str(folder) if path.exists() else source, revision=revision)
    if metadata is not None:
        return bool(metadata["weights"])
    return not path.exists() or any(folder.glob("*.safetensors")) or any(folder.glob("*.bin"))


def read_config(source: str, revision: str | None = None) -> dict[str, Any]:
    """The raw ``config.json`` of ``source``: that file, the one in that folder, or the one of that Hub repo at
    ``revision``. Raises OSError when it cannot be read, ValueError when it is not a JSON object."""
    path = Path(source)
    if revision is not None and path.exists():
        raise ValueError(f"`revision` is for a Hub repo id; {source} is a local path.")
    if path.is_dir():
        path = path / CONFIG_FILE
        if not path.is_file():
            raise OSError(f"The folder {source} has no {CONFIG_FILE}.")
    elif not path.exists():
        refuse_missing_folder(source)
        if not _REPO_ID.fullmatch(source) or source.endswith(".json"):
            raise OSError(f"{source}: no such file or folder, nor a Hub repo id (user/name).")
        path = _download(source, revision)
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise ValueError(f"{path} is not a JSON file: {error}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path} holds a JSON {type(config).__name__}, not a config object.")
    return config


def _download(repo_id: str, revision: str | None) -> Path:
    """The Hub repo's ``config.json``, downloaded (or the cached copy where the Hub cannot be reached:
    :func:`~hf_posenc.hub.reach.hub_unreachable`); a failure of the Hub is an OSError here (exit 2: the config could
    not be read), with its redacted message (the CLI prints it on one line, as every message)."""
    action = f"Reading {CONFIG_FILE} of {repo_id!r}" + (f" at {revision!r}" if revision else "")
    unreachable = hub_unreachable(repo_id, revision)
    if unreachable:
        cached = cached_file(repo_id, CONFIG_FILE, revision)
        if cached is None:
            raise OSError(
                f"{action} failed: the Hub cannot be reached ({unreachable}), and no copy of it is in the cache."
            )
        return cached
    try:
        return Path(call_hub(lambda: hf_hub_download(repo_id, CONFIG_FILE, revision=revision), HubError, action, None))
    except HubError as error:
        raise OSError(str(error)) from None
