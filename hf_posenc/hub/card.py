"""Model cards for patched models: metadata, method description, perplexity and lm-evaluation-harness results.

The card is rendered from ``model_cards/posenc_model.md`` with huggingface_hub's
:meth:`~huggingface_hub.ModelCard.from_template`. Its YAML header carries ``base_model``, the tags,
the license of the base model and a ``model-index`` with one perplexity per context length, which
the Hub and ``evaluate`` read back as :class:`~huggingface_hub.EvalResult` objects.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from ..record import PatchRecord
from ..registry import get_method
from ..reports.schema import read_report
from ..serving.engines import engine_findings
from ..spec import NONE_METHOD, parse_method_spec
from .errors import redact_secrets
from .markdown import markdown_code, markdown_text
from .provenance import Measured, measured_of
from .reach import check_card_names

TEMPLATE_PATH = Path(__file__).resolve().parent / "model_cards" / "posenc_model.md"
PLOT_FILE = "ppl_vs_length.png"

ARXIV_ID = re.compile(r"arXiv (\d{4}\.\d{4,5})")
DATA_SUFFIXES = (".txt", ".json", ".jsonl", ".parquet", ".csv", ".arrow")
# the fields of a results record that may hold a local path: eval's, and lm-eval's arguments (model_args, metadata)
PATH_KEYS = ("model", "name", "include_path", "pretrained", "tokenizer", "use_cache", "output_path")


@dataclass(frozen=True)
class EvalTable:
    """Perplexity rows of one method and of the unpatched base, read from an eval ``results.json``."""

    source: Path
    protocol: str
    bos: bool | None  # every window began with the BOS token (protocol_details.bos; None: a file not saying)
    model: str  # the model the weights come from (the base of a config-only push the results were measured on)
    dataset: str
    hub_dataset: bool  # a Hub id, not local files: only then the results go into model-index
    method_spec: str
    rows: list[tuple[int, float | None, float | None]]  # (length, base ppl, method ppl)
    results: list[dict[str, Any]]  # the results.json rows of the method and of none, for the plot
    measured_on: str = ""  # the --model of the run: a saved patched model, or the same as ``model``
    measured: Measured = Measured()  # what the file says of the weights, as a push compares them with its own
    saved_patch: str | None = None  # the method that --model was saved with (its patch undone for ``none``)
    report: dict[str, Any] = field(default_factory=dict, repr=False)  # the whole file as read (a push uploads it)

    @property
    def shown(self) -> dict[str, str]:
        """``model`` and ``measured_on`` as a card says them: local paths cut to their last part."""
        return {"model": _public_name(self.model), "measured_on": _public_name(self.measured_on)}

    def eval_results(self) -> list[EvalResult]:
        """One ``model-index`` perplexity per context length, for the method's finite rows on a Hub dataset
        (a local folder's label is no dataset id; inf / NaN are no valid metric values)."""
        if not self.hub_dataset:
            return []
        return [
            EvalResult(
                task_type="text-generation",
                task_name="Perplexity vs context length",
                dataset_type=self.dataset,
                dataset_name=self.dataset,
                metric_type="perplexity",
                metric_value=round(ppl, 4),
                metric_name=f"Perplexity at {length} tokens",
                metric_args={
                    "context_length": length,
                    "protocol": self.protocol,
                    **({} if self.bos is None else {"bos": self.bos}),
                },
            )
            for length, _, ppl in self.rows
            if ppl is not None and math.isfinite(ppl)
        ]


def load_eval_table(path: str | Path, record: PatchRecord) -> EvalTable:
    """Read an eval ``results.json`` and keep the rows of ``record``'s method and of ``none``.

    A row matches when its method name equals the patched method and each parameter it names
    equals the resolved parameter (``yarn:factor=4`` matches ``{"factor": 4.0, "beta_fast": 32, ...}``).

    Raises:
        ValueError: when the file is not an eval results file, no row matches the method, rows written
            with different specs both match, a matching row was measured with other resolved parameters
            (another trained context, say: another model).
    """
    path = Path(path)
    try:
        data = read_report(path, kind="perplexity", advice="pass the results.json of an `hf-posenc eval` run")
    except OSError as error:
        raise ValueError(f"Cannot read the eval results {path}: {error.strerror or error}.") from None
    spec = _matching_spec(data["results"], record, path, ("rows", "push without eval results"))
    method_ppl = _ppl_by_length(data["results"], spec)
    base_ppl = _ppl_by_length(data["results"], NONE_METHOD)
    rows = [(length, base_ppl.get(length), method_ppl.get(length)) for length in sorted({*method_ppl, *base_ppl})]
    details = data["dataset_details"]
    model = data.get("model_details") if isinstance(data.get("model_details"), dict) else {}
    name = str(details.get("name") or data["dataset"])
    hub_dataset = not details["local"] if "local" in details else _is_hub_dataset(name)
    return EvalTable(
        source=path,
        protocol=str(data["protocol"]),
        bos=_bos_of(data),
        model=str(model.get("weights_from") or data["model"]),
        dataset=str(data["dataset"]) if hub_dataset else Path(str(data["dataset"])).name,  # no local folders' names
        hub_dataset=hub_dataset,
        method_spec=spec,
        rows=rows,
        results=[row for row in data["results"] if row["method"] in (spec, NONE_METHOD)],
        measured_on=str(data["model"]),
        measured=measured_of(data),
        saved_patch=model.get("saved_patch"),
        report=data,
    )


def _bos_of(report: dict[str, Any]) -> bool | None:
    """Whether the windows began with BOS, as the eval recorded it; None where it did not (a hand-made file)."""
    details = report.get("protocol_details")
    bos = details.get("bos") if isinstance(details, dict) else None
    return bos if isinstance(bos, bool) else None


def _is_hub_dataset(name: str) -> bool:
    """For results files that do not record it: whether ``name`` reads as a Hub dataset id (``org/name`` or
    ``name``) rather than a local file or folder (absolute, relative, a data file's name, or existing here)."""
    return bool(name) and not _is_local_path(name) and Path(name).suffix not in DATA_SUFFIXES and name.count("/") <= 1


def _is_local_path(name: str) -> bool:
    path = Path(name).expanduser()
    return path.is_absolute() or name.startswith((".", "~")) or path.exists()


def public_results(value: Any) -> Any:
    """``value`` (a results record) with the local paths it names (:data:`PATH_KEYS`: a model, data or task folder)
    cut to their last part, and any secret (a token in lm-eval's ``model_args``) redacted: what a pushed
    ``eval_results.json`` or ``lm_eval.json`` may say of the machine."""
    return _public_paths(redact_secrets(value))


def _public_paths(value: Any) -> Any:
    if isinstance(value, list):
        return [_public_paths(item) for item in value]
    if isinstance(value, dict):
        return {key: _public_field(key, item) for key, item in value.items()}
    return value


def _public_field(key: str, item: Any) -> Any:
    if key in PATH_KEYS and isinstance(item, str):
        return _public_name(item)
    return _public_paths(item)


def _public_name(name: str) -> str:
    """A Hub id as it is; a local path cut to its last part (no local folders' names in a card or a pushed file)."""
    return Path(name).name if _is_local_path(name) else name


def _matching_spec(rows: list[dict[str, Any]], record: PatchRecord, path: Path, words: tuple[str, str]) -> str:
    """The one method spec of ``rows`` (results rows or lm-eval runs) that is ``record``'s method with its resolved
    parameters; ``words``: what the rows are, and the way out, for the errors."""
    specs = {row["method"] for row in rows}
    matching = sorted(spec for spec in specs if _spec_matches(spec, record))
    what, way_out = words
    if not matching:
        raise ValueError(
            f"{path} has no {what} of the pushed method {record.spec!r}; it has {sorted(specs)}. "
            f"Evaluate the method first, or {way_out}."
        )
    if len(matching) > 1:
        raise ValueError(f"{path} has several {what} matching {record.spec!r}: {matching}; keep one.")
    _check_resolved_params(rows, matching[0], record, path)
    return matching[0]


def _spec_matches(spec: str, record: PatchRecord) -> bool:
    name, params = parse_method_spec(spec)
    return _canonical(name) == record.method and all(
        key in record.params and _same_value(value, record.params[key]) for key, value in params.items()
    )


def _canonical(name: str) -> str | None:
    """The registered name of ``name`` (resolving aliases such as ``linear``); None if unknown."""
    try:
        return get_method(name).name
    except ValueError:
        return None


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(a, b, rel_tol=1e-9)
    if isinstance(a, list) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _check_resolved_params(rows: list[dict[str, Any]], spec: str, record: PatchRecord, path: Path) -> None:
    """The rows of ``spec`` were measured with the patch's resolved parameters: each of the record's (the attention
    backend aside: it does not change the numbers) is in the row's ``params``, with the same value. A row that
    records none (a hand-made or older file: ``params`` missing, null, or empty for a method that has some) or lacks
    some shows no such thing, and is refused too."""
    expected = {key: value for key, value in record.params.items() if key != "backend"}
    for row in rows:
        if row["method"] != spec:
            continue
        measured = row.get("params")
        missing = sorted(expected.keys() - (measured or {}).keys())
        if measured is None or missing:
            what = "no parameters" if not measured else f"no {', '.join(missing)}"
            raise ValueError(
                f"{path} records {what} for its {spec!r} rows: nothing shows they were measured with this patch's "
                "resolved parameters (its trained context, say). Evaluate this one, or leave the results out."
            )
        differ = sorted(key for key in expected if not _same_value(measured[key], expected[key]))
        if differ:
            details = ", ".join(f"{key}={measured[key]!r} there, {expected[key]!r} here" for key in differ)
            raise ValueError(
                f"{path} measured {spec!r} with other parameters than this patch ({details}): the results are "
                "of another model or setting. Evaluate this one, or leave the results out."
            )


def _ppl_by_length(rows: list[dict[str, Any]], spec: str) -> dict[int, float]:
    """``spec``'s perplexity at each length (one row each: :func:`read_report` refuses repeats)."""
    return {int(row["length"]): float(row["ppl"]) for row in rows if row["method"] == spec}


LM_EVAL_ADVICE = "pass the lm_eval.json of an `hf-posenc lm-eval` run"


@dataclass(frozen=True)
class LmEvalTable:
    """lm-evaluation-harness scores of one method and of the unpatched base, read from ``hf-posenc lm-eval``'s
    ``lm_eval.json``: one row per task and metric (standard errors aside)."""

    source: Path
    model: str  # as EvalTable's: the model the weights come from
    method_spec: str
    lm_eval_version: str
    max_length: int
    limit: float | None  # lm-eval's --limit: at most that many examples per task (a fraction below 1)
    rows: list[tuple[str, str, float | None, float | None]]  # (task, metric, none's score, the method's)
    measured: Measured = Measured()  # as EvalTable's
    report: dict[str, Any] = field(default_factory=dict, repr=False)  # the whole file as read (a push uploads it)


def load_lm_eval_table(path: str | Path, record: PatchRecord) -> LmEvalTable:
    """Read an ``lm_eval.json`` and keep the scores of ``record``'s method and of ``none``, as
    :func:`load_eval_table` keeps perplexities (the same matching, and the same errors)."""
    path = Path(path)
    try:
        data = read_report(path, kind="lm-eval", advice=LM_EVAL_ADVICE)  # one run per method, a numeric limit
    except OSError as error:
        raise ValueError(f"Cannot read the lm-eval results {path}: {error.strerror or error}.") from None
    runs = {run["method"]: run for run in data["runs"]}
    spec = _matching_spec(data["runs"], record, path, ("lm-eval runs", "leave the lm-eval results out"))
    method, base = runs[spec]["results"], runs.get(NONE_METHOD, {"results": {}})["results"]
    model, arguments = data.get("model_details", {}), data.get("arguments", {})
    return LmEvalTable(
        source=path,
        model=str(model.get("weights_from") or data["model"]),
        method_spec=spec,
        lm_eval_version=data["lm_eval_version"],
        max_length=data["max_length"],
        limit=arguments.get("limit"),
        rows=[
            (task, key.removesuffix(",none"), base.get(task, {}).get(key), value)
            for task, values in method.items()
            for key, value in values.items()
            if "_stderr," not in key
        ],
        measured=measured_of(data),
        report=data,
    )


ROLE_TAGS = {  # Hub tags of what a method changes (registry roles)
    "rope": "rope-scaling",
    "replace": "position-encoding-replacement",  # ALiBi, NoPE, sinusoidal, the T5 bias (the method is its own tag)
    "remap": "attention-remap",
    "temperature": "attention-temperature",
}


def render_card(
    config: Any,
    *,
    repo_id: str,
    base_model: str | None,
    base_revision: str | None,
    config_only: bool,
    added_tensors: bool = False,
    license_info: dict[str, str] | None = None,
    eval_table: EvalTable | None = None,
    encoding_plot: str | None = None,
    lm_eval_table: LmEvalTable | None = None,
    revision: str | None = None,
) -> ModelCard:
    """Render the model card of a patched model.

    Args:
        config (`PretrainedConfig`): the patched config (with its ``hf_posenc`` record).
        repo_id (`str`): the repo the card is for, used in the usage snippet and ``model-index``.
        base_model (`str`, *optional*): Hub id of the base model; ``None`` when it is not on the Hub.
        base_revision (`str`, *optional*): commit of the base model the patch was made for.
        config_only (`bool`): whether the repo holds no weights (they load from ``base_model``).
        added_tensors (`bool`, defaults to `False`): whether its weights hold tensors the patch added (a T5 table),
            which some engines refuse.
        license_info (`dict`, *optional*): ``license`` (and ``license_name``/``license_link``) of the base.
        eval_table (`EvalTable`, *optional*): perplexity rows to show and to put in ``model-index``.
        encoding_plot (`str`, *optional*): the repo's plot of the RoPE scaling's frequencies, to show
            (:func:`hf_posenc.plots.encoding_figures.write_patch_plot`).
        lm_eval_table (`LmEvalTable`, *optional*): lm-evaluation-harness scores to show.
        revision (`str`, *optional*): the branch of ``repo_id`` the card is for, which its snippets load (None: main).

    Raises:
        ValueError: ``base_model``, ``base_revision`` or a license field that is not a name of its kind
            (:func:`~hf_posenc.hub.reach.check_card_names`): the card writes them as they are.
    """
    check_card_names(base_model, base_revision, license_info or {})
    record = PatchRecord.from_config(config)
    eval_results = eval_table.eval_results() if eval_table else []
    method = get_method(record.method)
    paper = method.paper
    arxiv = ARXIV_ID.search(paper)
    card_data = ModelCardData(
        base_model=base_model,
        library_name="transformers",
        pipeline_tag="text-generation",
        tags=["hf-posenc", *(ROLE_TAGS[part.role] for part in method.components), "long-context", record.method],
        model_name=repo_id if eval_results else None,
        eval_results=eval_results or None,
        **(license_info or {}),
    )
    branch = None if revision == "main" else revision
    return ModelCard.from_template(
        card_data,
        template_path=str(TEMPLATE_PATH),
        repo_id=repo_id,
        revision=branch,
        base_model=base_model,
        base_revision=base_revision,
        config_only=config_only,
        record=record,
        max_position_embeddings=config.max_position_embeddings,
        paper=paper,
        paper_url=f"https://arxiv.org/abs/{arxiv.group(1)}" if arxiv else None,
        eval_table=eval_table,
        plot_file=PLOT_FILE if eval_table else None,
        encoding_plot=encoding_plot,
        lm_eval_table=lm_eval_table,
        engines=engine_findings(config.to_dict(), added_tensors=added_tensors),
        md=markdown_text,  # names from results files: literal text, whatever markdown they hold
        code=markdown_code,
        check_command=shlex.join(["hf-posenc", "check", repo_id, *(["--revision", branch] if branch else [])]),
    )
