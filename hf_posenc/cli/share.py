"""``hf-posenc push`` and ``hf-posenc card``: thin argparse wrappers over :mod:`hf_posenc.hub.push`.

A config-only push and ``card`` read only the base model's config: the model is built on the meta
device (no weights downloaded) and patched there, which writes the same config as a real patch. ``card
--with-weights --results`` loads the weights, as such a push does, to compare their fingerprint with the results'.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import TYPE_CHECKING

from ..spec import MethodSpec

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from ..hub.saved import SavedPatch

# Library parameters whose flag has another name.
PARAMETER_FLAGS = {"base_model": "--model", "base_revision": "--model-revision", "eval_results": "--results"}

PUSH_EXAMPLES = """examples:
  hf-posenc push --model Qwen/Qwen2.5-0.5B --method yarn:factor=4 --repo me/Qwen2.5-0.5B-yarn-x4
  hf-posenc push --model Qwen/Qwen2.5-0.5B --method yarn:factor=4 --repo me/Qwen2.5-0.5B-yarn-x4 \\
      --results runs/yarn/results.json --with-weights --private
"""
CARD_EXAMPLES = """examples:
  hf-posenc card --model Qwen/Qwen2.5-0.5B --method yarn:factor=4 --results runs/yarn/results.json
  hf-posenc card --model Qwen/Qwen2.5-0.5B --method yarn:factor=4 --output README.md
  hf-posenc card --model Qwen/Qwen2.5-0.5B --method yarn:factor=4 --lm-eval-results runs/yarn/lm_eval.json
"""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``push`` and ``card`` subcommands; each sets ``func(args) -> int`` as default."""
    push = subparsers.add_parser(
        "push",
        help="push a patched config (or full model) and its model card to the Hub",
        description="Patch a model and push it to the Hub in one commit. By default only the config, "
        "the card and a record of the base model and commit are pushed; the weights stay in the base repo.",
        epilog=PUSH_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_model_arguments(push)
    push.add_argument("--repo", required=True, help="target repo, user/name")
    push.add_argument("--private", action="store_true", help="create the repo private")
    push.add_argument("--exist-ok", action="store_true", help="push a new commit to an existing repo")
    push.add_argument("--revision", help="branch to commit to (created from main if missing)")
    push.add_argument("--commit-message", help="commit summary")
    push.set_defaults(
        func=run_push,
        parameter_flags=PARAMETER_FLAGS,
        interrupted="interrupted: a push is one commit, so the repo holds all of it or none of it (the repo and the "
        "--revision branch may exist already, empty); look at the repo, and rerun with --exist-ok to push again.",
    )

    card = subparsers.add_parser(
        "card",
        help="render the model card of a patched model locally (no push)",
        epilog=CARD_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_model_arguments(card)
    card.add_argument(
        "--repo",
        help="repo id named in the card's snippets and title, user/name (default: <model>-<method>, or the name of "
        "a model saved with the method that names it already)",
    )
    card.add_argument("--revision", help="branch of --repo the card is for, loaded in its snippets (as push's)")
    card.add_argument(
        "--output",
        type=Path,
        help="write the card to this file instead of printing it (the images it shows, ppl_vs_length.png and "
        "frequencies.png, are those push uploads beside it; a local card names them without writing them)",
    )
    card.set_defaults(func=run_card, parameter_flags=PARAMETER_FLAGS)


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="base model: Hub id (or local folder with --with-weights)")
    parser.add_argument("--model-revision", help="branch, tag or commit of --model (default: main)")
    parser.add_argument("--method", required=True, help="method spec, e.g. yarn:factor=4")
    parser.add_argument("--results", type=Path, help="eval results.json to show in the card")
    parser.add_argument("--lm-eval-results", type=Path, help="lm_eval.json of hf-posenc lm-eval to show in the card")
    parser.add_argument("--license", help="license for the card (default: the base model's)")
    parser.add_argument("--with-weights", action="store_true", help="a full model (safetensors), not config-only")
    parser.add_argument("--token", help="Hub token, to read the base model and push (default: saved login or HF_TOKEN)")


def run_push(args: argparse.Namespace) -> int:
    from ..hub.push import push_to_hub
    from ..hub.reach import check_target, require_push_access

    check_target(args.repo, args.revision, args.license)  # before the model loads
    spec, saved = _method_and_saved(args, weights=args.with_weights)
    base_model, base_revision = _weights_source(args, saved)
    require_push_access(args.repo, args.token)
    tokenizer = _tokenizer(base_model, base_revision, args.token) if args.with_weights else None  # before the weights
    model, fingerprint = _patched_model(args, spec, saved, with_weights=args.with_weights)
    commit = push_to_hub(
        model,
        args.repo,
        eval_results=args.results,
        lm_eval_results=args.lm_eval_results,
        with_weights=args.with_weights,
        tokenizer=tokenizer,
        base_model=base_model,
        base_revision=base_revision,
        license=args.license,
        private=args.private or None,
        exist_ok=args.exist_ok,
        revision=args.revision,
        commit_message=args.commit_message,
        token=args.token,
        weights_fingerprint=fingerprint,
    )
    print(commit.commit_url)
    return 0


def run_card(args: argparse.Namespace) -> int:
    from ..files import atomic_write_text
    from ..hub.push import build_card
    from ..hub.reach import check_license, check_target
    from ..record import PatchRecord

    if args.output is not None and args.output.is_dir():
        raise ValueError(
            f"`output` {args.output} is a folder; name the card's file (e.g. {args.output / 'README.md'})."
        )
    inputs = [Path(path) for path in (args.results, args.lm_eval_results) if path is not None]
    if args.output is not None and any(args.output.resolve() == path.resolve() for path in inputs):
        raise ValueError(f"`output` {args.output} is a results file the card reads; name another file for the card.")
    if args.repo is not None:  # before the model loads
        check_target(args.repo, args.revision, args.license)
    check_license(args.license)
    fingerprinted = args.with_weights and args.results is not None  # as push compares them: the weights loaded
    spec, saved = _method_and_saved(args, weights=fingerprinted)
    base_model, base_revision = _weights_source(args, saved)
    model, fingerprint = _patched_model(args, spec, saved, with_weights=fingerprinted)
    method = PatchRecord.from_config(model.config).method
    card = build_card(
        model,
        args.repo or _default_repo(base_model, method, saved),
        eval_results=args.results,
        lm_eval_results=args.lm_eval_results,
        with_weights=args.with_weights,
        base_model=base_model,
        base_revision=base_revision,
        license=args.license,
        token=args.token,
        revision=args.revision,
        weights_fingerprint=fingerprint,
    )
    if args.output is None:
        print(card)
    else:
        atomic_write_text(args.output, str(card))
    return 0


def _tokenizer(source: str, revision: str | None, token: str | None) -> PreTrainedTokenizerBase:
    """The tokenizer of ``source``, the repo or folder the weights come from, which a push of the weights carries
    (a config-only repo's card says to load the base's). A folder or repo without one, or one that does not load,
    is a ``ValueError`` naming it and what it lacks."""
    from huggingface_hub import HfApi
    from transformers import AutoTokenizer

    from ..hub.commit import TOKENIZER_SOURCES, holds_tokenizer
    from ..hub.errors import HubError, call_hub

    folder = Path(source)
    action = f"Reading the tokenizer of {source!r}"
    if folder.is_dir():
        files, place = {path.name for path in folder.iterdir()}, f"the folder {source}"
    else:
        listed = call_hub(
            lambda: HfApi(token=token).list_repo_files(source, revision=revision), HubError, action, token
        )
        files, place = set(listed), f"the repo {source!r}"
    if not holds_tokenizer(files):
        raise ValueError(
            f"`with_weights` pushes the tokenizer with the weights, and {place} holds none (no "
            f"{', '.join(TOKENIZER_SOURCES)}): save the model's tokenizer there (`tokenizer.save_pretrained`)."
        )
    try:
        return call_hub(
            lambda: AutoTokenizer.from_pretrained(source, revision=revision, token=token), HubError, action, token
        )
    except ValueError as error:  # transformers: no tokenizer file it can read (sentencepiece or tiktoken missing...)
        raise ValueError(
            f"`with_weights` pushes the tokenizer with the weights, and that of {source!r} does not load: {error}"
        ) from None


def _method_and_saved(args: argparse.Namespace, *, weights: bool) -> tuple[MethodSpec, SavedPatch | None]:
    """``--method``, and the patch ``--model`` was saved or pushed with, if any (:mod:`hf_posenc.hub.saved`): a Hub
    model not in the cache (with ``weights``, the weights it loads too) where the Hub cannot be reached fails there,
    before anything is read (:func:`~hf_posenc.eval.models.reachable_saved_patch`)."""
    from ..eval.models import reachable_saved_patch

    spec = MethodSpec.parse(args.method)
    if spec.unpatched:
        raise ValueError("`method` 'none' is the unpatched model: there is no patch to push or describe.")
    saved = reachable_saved_patch(args.model, revision=args.model_revision, token=args.token, weights=weights)
    if saved is not None and saved.weights_gguf_file:
        raise ValueError(
            f"`model` {args.model} takes its weights from the GGUF file {saved.weights_gguf_file} of "
            f"{saved.weights_from}, which a repo's card cannot name as its base: load it with "
            "hf_posenc.from_pretrained and push it with its weights (hf_posenc.push_to_hub(..., with_weights=True))."
        )
    return spec, saved


def _default_repo(base_model: str, method: str, saved: SavedPatch | None) -> str:
    """The card's repo id without ``--repo``: ``<model>-<method>``, or the model's own name where the model was saved
    with ``method`` and its name already names it (a folder ``smol-yarn4``, not ``smol-yarn4-yarn``)."""
    name = base_model.rstrip("/").split("/")[-1]
    named = _names_method(name, method)
    return name if saved is not None and saved.record.method == method and named else f"{name}-{method}"


def _names_method(name: str, method: str) -> bool:
    """Whether ``name`` holds ``method`` as a word of its own, a number after it allowed (``smol-yarn4``, ``yarn4x``,
    ``yarn128k``, ``tiny_yarn-x4``; not ``tiny-pixel`` for ``pi``), not as part of a longer method's name
    (``dynamic-yarn``)."""
    from ..registry import available_methods

    def spans(word: str) -> list[tuple[int, int]]:
        pattern = rf"(?:^|(?<=[-_.])){re.escape(word)}(?:x?[\d.]*\d[xk]?)?(?=$|[-_.])"
        return [match.span() for match in re.finditer(pattern, name, re.IGNORECASE)]

    longer = [span for other in available_methods() if other != method and method in other for span in spans(other)]
    return any(not any(a <= start and end <= b for a, b in longer) for start, end in spans(method))


def _weights_source(args: argparse.Namespace, saved: SavedPatch | None) -> tuple[str, str | None]:
    """The repo (or folder) and revision the weights of ``--model`` come from: for a config-only repo pushed, the base
    repo and commit it names."""
    if saved is not None and saved.weights_from is not None:
        return saved.weights_from, saved.weights_revision
    return args.model, args.model_revision


def _patched_model(
    args: argparse.Namespace, spec: MethodSpec, saved: SavedPatch | None, *, with_weights: bool
) -> tuple[PreTrainedModel, str | None]:
    """The base model of ``--model`` patched with ``spec`` (real weights, or on the meta device for config-only),
    and with real weights their fingerprint before the patch, as ``hf-posenc eval`` records it. A model saved or
    pushed patched (``saved``) is its base with the saved patch undone (:mod:`hf_posenc.hub.saved`)."""
    import torch
    from transformers import AutoModelForCausalLM

    from ..hub.fingerprint import model_fingerprint
    from ..hub.saved import base_config, load_base_model, restore_saved_tensors
    from ..patching import patch

    hub_kwargs = {"revision": args.model_revision, "token": args.token}
    fingerprint = None
    if with_weights:
        model = load_base_model(args.model, saved, **{k: v for k, v in hub_kwargs.items() if v is not None})
        fingerprint = model_fingerprint(model)
    else:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(base_config(args.model, saved, **hub_kwargs))
    patch(model, spec.method, **spec.params)
    restore_saved_tensors(model)  # its saved method asked again: the trained T5 table, not the patch's start
    return model, fingerprint
