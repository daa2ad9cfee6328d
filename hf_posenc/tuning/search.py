"""``run_tune`` and ``tune``: the best training-free extension of a model to a target length, measured.

The candidates (:func:`~hf_posenc.tuning.space.search_space`) and the unpatched model are scored by one perplexity
run (:func:`~hf_posenc.eval.run_perplexity`, truncate protocol) at the target ``T`` and at lengths inside the
trained context ``L``: a method whose output does not depend on the input's length scores each document with one
forward at ``T`` and reads the shorter lengths from it. That run's folder (``perplexity/`` in the output) resumes:
a killed tune loses at most the candidate it was on, and a rerun with more candidates computes only the new ones.

With a ``budget`` smaller than the candidates, each is screened first on the first window at a shorter length
(halfway from ``L`` to ``T``; its own resumable folder, ``screening/``), and the ``budget`` best go on to the full
run. Screening costs one forward per candidate at that length; the full run one per kept candidate and document at
``T``.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accelerate import PartialState

from ..eval.data import TextSource, build_windows, load_texts, tokenize_texts
from ..eval.folder import PASSKEY_JSON, RESULTS_JSON
from ..eval.models import (
    EvalModel,
    LoadedModel,
    load_tokenizer,
    read_base_config,
    resolve_bos,
    trained_context,
)
from ..eval.passkey import build_prompt, random_keys
from ..eval.runner import (
    PasskeyConfig,
    PerplexityConfig,
    check_passkey_output,
    check_perplexity_output,
    run_passkey,
    run_perplexity,
)
from ..files import atomic_write_text, default_output, json_text
from ..patching.dispatch import planner_for_config
from ..plots.tuning_figure import plot_tune
from ..registry import get_method
from ..reports.runs import PerplexityReport
from ..reports.tasks import LM_EVAL_JSON
from ..reports.tune_report import TUNE_CSV, TUNE_JSON, TuneReport, TuneRow
from ..spec import NONE_METHOD
from .ranking import rank
from .space import Candidate, check_families, search_space
from .winner import WINNER_FOLDER, save_winner

logger = logging.getLogger("hf_posenc")

PERPLEXITY_FOLDER = "perplexity"
SCREENING_FOLDER = "screening"
PASSKEY_FOLDER = "passkey"
PASSKEY_DEPTHS = [0.0, 0.5, 1.0]
TUNE_PLOT = "tune.png"
DEFAULT_MAX_REGRESSION = 0.03  # a winner's perplexity inside L is at most 3% above the unpatched model's


@dataclass(frozen=True)
class TuneConfig:
    """What a tune searches and how it scores (``hf-posenc tune``'s options).

    Attributes:
        target_length (`int`, *optional*): the length ``T`` to reach; None: twice the trained context.
        methods (`list[str]`, *optional*): the families to search (``["yarn", "self-extend"]``); None: all.
        budget (`int`, *optional*): at most this many candidates get the full run, the best of a screening; None:
            all of them.
        max_regression (`float`, defaults to 0.03): the largest perplexity increase inside the trained context,
            against the unpatched model, that a winner may have (0.03: 3%).
        short_lengths (`list[int]`, *optional*): the lengths inside ``L`` the regression is measured at; None:
            ``L / 4`` and ``L``.
        logn (`bool`, defaults to `True`): each candidate with log-n too, where it combines.
        blocks (`int`, defaults to 8): the blocks each window's tokens are cut into for the standard errors.
        batch_size (`int`, defaults to 1): windows per forward.
        passkey_trials (`int`, defaults to 0): above 0, the passkey accuracy at ``T`` of every candidate fully run
            too, with this many keys at each of the depths 0, 0.5 and 1 (``passkey/`` in the output).
    """

    target_length: int | None = None
    methods: Sequence[str] | None = None
    budget: int | None = None
    max_regression: float = DEFAULT_MAX_REGRESSION
    short_lengths: Sequence[int] | None = None
    logn: bool = True
    blocks: int = 8
    batch_size: int = 1
    passkey_trials: int = 0

    def __post_init__(self) -> None:
        for name in ("target_length", "budget"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"`{name}` must be a whole number >= 1, got {value!r}.")
        regression = self.max_regression
        if isinstance(regression, bool) or not isinstance(regression, (int, float)) or not 0 <= regression < math.inf:
            raise ValueError(f"`max_regression` must be a finite number >= 0 (0.03: 3%), got {regression!r}.")
        if isinstance(self.blocks, bool) or not isinstance(self.blocks, int) or self.blocks < 2:
            raise ValueError(f"`blocks` must be a whole number >= 2 (standard errors need two), got {self.blocks!r}.")
        if self.short_lengths is not None and not all(isinstance(n, int) and n > 1 for n in self.short_lengths):
            raise ValueError(f"`short_lengths` must be whole numbers of tokens > 1, got {list(self.short_lengths)}.")
        if self.methods is not None:
            check_families(self.methods)
        if self.passkey_trials:
            PasskeyConfig(lengths=[1], trials=self.passkey_trials)  # its own bounds on the keys


@dataclass(frozen=True)
class _Plan:
    """A tune's lengths and candidates, fixed before any model loads."""

    trained: int
    target: int
    short: list[int]
    candidates: list[Candidate]


def _plan(model_config: Any, config: TuneConfig) -> _Plan:
    """The lengths and candidates of a tune of the model ``model_config`` describes; ``ValueError`` for a target
    inside its trained context, short lengths outside it, or no candidate that reaches the target and patches such a
    model."""
    trained = trained_context(model_config)
    target = config.target_length or 2 * trained
    short = sorted(set(config.short_lengths or [trained // 4, trained]))
    outside = [n for n in short if n > trained]
    if outside:
        raise ValueError(f"`short_lengths` {outside} are past the trained context {trained}: give lengths inside it.")
    reaching = search_space(trained, target, config.methods, config.logn)
    candidates = [c for c in reaching if planner_for_config(model_config, get_method(c.spec.method)) is not None]
    if not candidates:
        families = ", ".join(config.methods) if config.methods else "any family"
        if reaching:
            kind = getattr(model_config, "model_type", type(model_config).__name__)
            raise ValueError(
                f"No candidate of {families} applies to a {kind} model: a tune searches RoPE scalings and remaps, "
                "for models whose positions are RoPE's."
            )
        raise ValueError(f"No candidate of {families} takes a model trained on {trained} tokens to {target}.")
    return _Plan(trained, target, short, candidates)


def run_tune(model_source: EvalModel, text_source: TextSource, config: TuneConfig, output: Path) -> TuneReport:
    """Score every candidate that takes the model to the target length, and rank them: the winner is the lowest
    perplexity at ``T`` among the candidates whose regression inside ``L`` stays within ``max_regression``;
    candidates within noise of it (paired standard errors over blocks of tokens) are reported as tied.

    The model's config, the candidates, the output folder and the data are checked before the model is loaded.
    Writes ``tune.json``, ``tune.csv`` and ``tune.png`` into ``output``, beside the perplexity run's folder, and
    the winner as a config-only folder (``best/``, :func:`~hf_posenc.tuning.winner.save_winner`).

    Args:
        model_source (`ModelSource` or `LoadedModel`): the model, and how to load it (or the model in memory).
        text_source (`TextSource`): the documents (each scored on its first ``T`` tokens).
        config (`TuneConfig`): the target, the families and the budget.
        output (`Path`): the tune's folder.

    Raises:
        ValueError: a target inside the trained context, no candidate reaching it, data too short for it, an
            output folder holding other results.
    """
    start = time.perf_counter()
    output = Path(output)
    plan = _plan(read_base_config(model_source), config)
    _check_output(output)
    screens = config.budget is not None and config.budget < len(plan.candidates)
    check_perplexity_output(
        model_source, text_source, _full_run(plan, plan.candidates, config), output / PERPLEXITY_FOLDER
    )
    _check_before_forwards(model_source, text_source, plan.target, screens, config.passkey_trials > 0)
    if config.passkey_trials:
        check_passkey_output(model_source, _passkey_run(plan.candidates, plan.target, config), output / PASSKEY_FOLDER)
    candidates, screened_out, screening = plan.candidates, [], None
    if screens:
        screening = plan.trained + (plan.target - plan.trained) // 2
        candidates, screened_out = _screen(model_source, text_source, config, plan, screening, output)
    run = _full_run(plan, candidates, config)
    logger.debug("tune: %d candidates at %d tokens", len(candidates), plan.target)
    measured = run_perplexity(model_source, text_source, run, output / PERPLEXITY_FOLDER)
    rows = rank(measured, candidates, plan.target, plan.short, config.max_regression)
    if config.passkey_trials:
        rows = _with_passkey(model_source, rows, candidates, plan.target, config, output)
    report = TuneReport(
        model=measured.model,
        dataset=measured.dataset,
        trained_context=plan.trained,
        target_length=plan.target,
        short_lengths=plan.short,
        max_regression=config.max_regression,
        reference={r.length: r.ppl for r in measured.results if r.method == NONE_METHOD},
        rows=tuple(rows),
        screened_out=screened_out,
        screening_length=screening,
        seconds=round(time.perf_counter() - start, 2),
    )
    if PartialState().is_main_process:
        _write(output, report, measured)
        save_winner(model_source, report, output / WINNER_FOLDER, commit=measured.model_details.get("commit"))
    return report


def tune(
    model: Any,
    tokenizer: Any,
    texts: Sequence[str] | TextSource,
    target_length: int | None = None,
    *,
    output: str | Path | None = None,
    **options: Any,
) -> TuneReport:
    """The tune of a model in memory: :func:`run_tune` on ``LoadedModel(model, tokenizer)``.

    >>> report = hf_posenc.tune(model, tokenizer, texts, target_length=32768)
    >>> report.best  # a MethodSpec

    Args:
        model (`PreTrainedModel`): an unpatched causal LM with RoPE; each candidate is patched in and removed again.
        tokenizer: its tokenizer.
        texts (`list[str]` or `TextSource`): the documents, or where to read them.
        target_length (`int`, *optional*): the length ``T`` to reach; None: twice the trained context.
        output (`str` or `Path`, *optional*): the tune's folder, resumable; None: ``hf-posenc-results/tune-<name>``
            (the model's name, or its class).
        **options: the other fields of :class:`TuneConfig` (``methods``, ``budget``, ``max_regression``, ...).

    Raises:
        ValueError: texts that are not a list of strings, an option out of its bounds, a patched model or no
            tokenizer, or what :func:`run_tune` refuses (a folder of other texts: a resume compares them).
        TypeError: an option :class:`TuneConfig` does not have.
    """
    config = TuneConfig(target_length, **options)
    source = texts if isinstance(texts, TextSource) else TextSource.from_texts(texts)
    loaded = LoadedModel(model, tokenizer)
    folder = Path(output) if output is not None else default_output("tune", loaded.label)
    return run_tune(loaded, source, config, folder)


def _full_run(plan: _Plan, candidates: list[Candidate], config: TuneConfig) -> PerplexityConfig:
    """The perplexity run that scores ``candidates`` and the unpatched model at ``T`` and inside ``L``."""
    methods = [NONE_METHOD, *(candidate.text for candidate in candidates)]
    return PerplexityConfig(
        lengths=[*plan.short, plan.target], methods=methods, blocks=config.blocks, batch_size=config.batch_size
    )


def _check_output(output: Path) -> None:
    """``ValueError`` where ``output`` holds another command's results: a tune writes its runs into folders of
    their own, and its report beside them."""
    foreign = [name for name in (RESULTS_JSON, PASSKEY_JSON, LM_EVAL_JSON) if (output / name).exists()]
    if foreign:
        raise ValueError(
            f"`output` {output} holds the {foreign[0]} of another run; a tune writes its own runs into folders "
            "inside it: choose another folder."
        )


def _check_before_forwards(
    model_source: EvalModel, text_source: TextSource, target: int, screens: bool, passkey: bool
) -> None:
    """What only the tokenizer can refuse, before any forward: a target no document reaches (the full run checks it
    itself, after a screening's forwards) and one too short for a passkey prompt."""
    if not screens and not passkey:
        return
    tokenizer = load_tokenizer(model_source, model_source.saved_patch())
    bos_id = resolve_bos("auto", tokenizer)
    if screens:
        docs = tokenize_texts(tokenizer, load_texts(text_source))
        build_windows([len(doc) for doc in docs], target, "truncate", bos=bos_id is not None)
    if passkey:
        build_prompt(tokenizer, target, 0.5, random_keys(1, 0)[0], bos_id)


def _screen(
    model_source: EvalModel,
    text_source: TextSource,
    config: TuneConfig,
    plan: _Plan,
    length: int,
    output: Path,
) -> tuple[list[Candidate], list[str]]:
    """The ``budget`` most promising candidates, and the others: every one scored on the first window at
    ``length`` (and inside ``L``, read from the same forward), ranked as the full run ranks."""
    methods = [NONE_METHOD, *(candidate.text for candidate in plan.candidates)]
    run = PerplexityConfig(lengths=[*plan.short, length], methods=methods, max_windows=1, blocks=config.blocks)
    logger.debug("tune: screening %d candidates at %d tokens, keeping %d", len(methods) - 1, length, config.budget)
    measured = run_perplexity(model_source, text_source, run, output / SCREENING_FOLDER)
    order = [row.method for row in rank(measured, plan.candidates, length, plan.short, config.max_regression)]
    kept = set(order[: config.budget])
    return [c for c in plan.candidates if c.text in kept], [c.text for c in plan.candidates if c.text not in kept]


def _passkey_run(candidates: list[Candidate], target: int, config: TuneConfig) -> PasskeyConfig:
    """The passkey run of ``candidates`` at ``target``."""
    methods = [candidate.text for candidate in candidates]
    return PasskeyConfig(lengths=[target], methods=methods, depths=PASSKEY_DEPTHS, trials=config.passkey_trials)


def _with_passkey(
    model_source: EvalModel,
    rows: list[TuneRow],
    candidates: list[Candidate],
    target: int,
    config: TuneConfig,
    output: Path,
) -> list[TuneRow]:
    """``rows`` with each candidate's passkey accuracy at ``target`` (a resumable passkey run, ``passkey/``), over
    its prompts."""
    measured = run_passkey(model_source, _passkey_run(candidates, target, config), output / PASSKEY_FOLDER)
    found = {}
    for trial in measured.trials:
        found.setdefault(trial.method, []).append(trial.correct)
    return [
        dataclasses.replace(
            row, passkey=sum(found[row.method]) / len(found[row.method]), passkey_trials=len(found[row.method])
        )
        for row in rows
    ]


def _write(output: Path, report: TuneReport, measured: PerplexityReport) -> None:
    """tune.json, tune.csv and tune.png, each written atomically."""
    atomic_write_text(output / TUNE_JSON, json_text(report.to_json()))
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(report.csv_rows())
    atomic_write_text(output / TUNE_CSV, buffer.getvalue())
    plot_tune(
        output / TUNE_PLOT,
        measured.results,
        report.rows,
        trained_context=report.trained_context,
        max_regression=report.max_regression,
        title=f"tune: {report.model} to {report.target_length} tokens on {report.dataset}",
    )
