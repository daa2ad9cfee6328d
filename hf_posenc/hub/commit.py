"""The one commit a push makes: the files staged for it, on the branch asked for, replacing what an earlier push
wrote there.

A branch the push creates for its commit (``revision``, created from ``main`` when missing) is deleted again when
the commit fails, so that a failed push leaves no branch behind; a failure to delete it is told in the error raised
(a note on it, which :func:`~hf_posenc.hub.errors.call_hub` keeps in its message), never hiding the failure itself.
"""

from __future__ import annotations

from pathlib import Path

from huggingface_hub import CommitInfo, HfApi
from huggingface_hub.errors import HfHubHTTPError

from ..plots.encoding_figures import FREQUENCY_PLOT
from .card import PLOT_FILE
from .errors import redact

RESULTS_FILE = "eval_results.json"
LM_EVAL_FILE = "lm_eval.json"
# What a tokenizer loads from, one of them at least: its config, or the vocabulary of transformers' tokenizers of
# causal LMs (BPE, WordPiece, SentencePiece), or mistral-common's (what MistralCommonBackend saves alone).
TOKENIZER_SOURCES = (
    "tokenizer_config.json",
    "tokenizer.json",
    "vocab.json",
    "vocab.txt",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tekken.json",
)


def holds_tokenizer(names: set[str]) -> bool:
    """Whether a folder or repo with files ``names`` holds a tokenizer (one of :data:`TOKENIZER_SOURCES`)."""
    return not names.isdisjoint(TOKENIZER_SOURCES)


# The files a tokenizer's save_pretrained writes: those, and its special tokens, BPE merges and chat templates.
TOKENIZER_FILES = (
    *TOKENIZER_SOURCES,
    "special_tokens_map.json",
    "added_tokens.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "additional_chat_templates/*.jinja",
)
# Files a push writes that a later push to the same repo may not write again: removed in that push's commit
# (unless it writes them), so a repo never mixes two pushes (a config-only push over earlier weights and tokenizer).
# Names save_pretrained gives (huggingface_hub matches with fnmatch, whose * also matches "/": each pattern
# starts with a name, so files in other folders and other weights, adapter_model.safetensors say, never match).
PUSH_ARTIFACTS = (
    *TOKENIZER_FILES,
    "model.safetensors",
    "model-*-of-*.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model-*-of-*.bin",
    "pytorch_model.bin.index.json",
    "generation_config.json",
    RESULTS_FILE,
    LM_EVAL_FILE,
    PLOT_FILE,
    FREQUENCY_PLOT,
)


def commit_folder(
    api: HfApi, repo_id: str, folder: Path, *, revision: str | None, message: str, token: str | None
) -> CommitInfo:
    """Upload ``folder`` to ``repo_id`` in one commit on the branch ``revision``, removing the
    :data:`PUSH_ARTIFACTS` that ``folder`` does not hold.

    Args:
        api (`HfApi`): the client the requests go through.
        repo_id (`str`): the repo, ``"user/name"``; it exists.
        folder (`Path`): the staged files.
        revision (`str` or `None`): the branch; None: ``main``. One other than ``main`` is created from ``main``
            when missing, and then deleted again if the commit fails.
        message (`str`): the commit message.
        token (`str` or `None`): the token the requests carry, redacted from the note on a branch left behind.

    Returns:
        `CommitInfo`: the commit made.

    Raises:
        HfHubHTTPError: the Hub refused or failed creating the branch or the commit (with a note where a branch
            created for it could not be deleted); any other error of the upload is raised as it is.
    """
    created = revision not in (None, "main") and _create_branch(api, repo_id, revision)
    try:
        return api.upload_folder(
            repo_id=repo_id,
            folder_path=folder,
            revision=revision,
            commit_message=message,
            delete_patterns=list(PUSH_ARTIFACTS),
        )
    except BaseException as failure:
        if created:
            _delete_branch(api, repo_id, revision, failure, token)
        raise


def _create_branch(api: HfApi, repo_id: str, branch: str) -> bool:
    """Create ``branch`` of ``repo_id`` from ``main``; whether this call created it (False: it was there)."""
    try:
        api.create_branch(repo_id, branch=branch)
    except HfHubHTTPError as error:
        if error.response is not None and error.response.status_code == 409:
            return False
        raise
    return True


def _delete_branch(api: HfApi, repo_id: str, branch: str, failure: BaseException, token: str | None) -> None:
    """Delete ``branch``, created for a commit that failed with ``failure``; if that fails too, say so in a note on
    ``failure``, the error still raised."""
    try:
        api.delete_branch(repo_id, branch=branch)
    except Exception as error:
        said = f"{type(error).__name__}: {error}"
        failure.add_note(
            redact(f"The branch {branch!r} this push created could not be deleted ({said}); delete it.", token)
        )
