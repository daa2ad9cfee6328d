"""What a training run is and where it resumes: ``train_run.json`` (written first, compared on ``resume``) and
the newest checkpoint the Trainer finished writing."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from accelerate import PartialState
from transformers import PreTrainedConfig, PreTrainedModel, TrainerCallback
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from transformers.utils import CONFIG_NAME

from ..files import (
    CHECK_PREFIX,
    atomic_write_text,
    lock_is_held,
    nearest_existing,
    same_place,
    try_lock,
    write_problem,
)
from ..hub.fingerprint import model_fingerprint
from ..spec import MethodSpec
from .packing import PackedWindows
from .settings import TrainSettings
from .trainer_arguments import resolved_bf16

logger = logging.getLogger(__name__)

RUN_FILE = "train_run.json"
RUN_FORMAT = 1
ORIGINAL_SUFFIX = ".hf-posenc-original"  # a trimmed checkpoint config.json as it was, beside it
RUN_LOCK = ".hf-posenc-train.lock"  # held by the run's first process while it trains
STATE_FILES = ("optimizer.pt", "scheduler.pt", "scaler.pt")  # the Trainer's torch.save files of a checkpoint


def run_identity(
    model: PreTrainedModel, spec: MethodSpec, settings: TrainSettings, data: PackedWindows, processes: int
) -> dict[str, Any]:
    """What a run is (``train_run.json``): a resumed run must match it. The model is its name, and its weights as
    handed in: their dtype and :func:`~hf_posenc.hub.fingerprint.model_fingerprint` (another GGUF file of one folder,
    or the same model loaded in another dtype, is another run), and the processes it trains on (each takes its own
    windows of every step)."""
    run_settings = settings.recorded()  # the defaults of LoRA's and the same given are one run
    return {
        "format": RUN_FORMAT,
        "model": str(model.name_or_path),
        "weights": {"dtype": str(model.dtype).removeprefix("torch."), "fingerprint": model_fingerprint(model)},
        "method": spec.text,
        "settings": run_settings,
        "bf16": resolved_bf16(model, settings),  # as it trains: the default (None) depends on the machine
        "processes": processes,
        "data_sha256": data.fingerprint(),
    }


def check_output(output_dir: Path, identity: dict[str, Any] | None, resume: bool) -> None:
    """Raise ``ValueError`` unless ``output_dir`` can take the run ``identity``: new or empty, or (with ``resume``)
    holding the same run. ``identity`` None checks only what needs no data: the folder holds nothing else."""
    existing = nearest_existing(output_dir, "output_dir")  # a link to nothing refused
    if output_dir.exists() and not output_dir.is_dir():
        raise ValueError(f"`output_dir` {output_dir} is a file; give a folder.")
    if write_problem(existing) is not None:  # before the model and the data load, not at the first file written
        where = "" if existing == output_dir else f": {existing} is not writable"
        raise ValueError(f"`output_dir` {output_dir} cannot be written{where}; choose a folder you can write to.")
    if not output_dir.is_dir() or all(_no_runs_file(path) for path in output_dir.iterdir()):
        return  # new or empty: another run's check folder (write_problem's, made and removed) is not its files
    run_file = output_dir / RUN_FILE
    if not run_file.is_file():
        raise ValueError(f"`output_dir` {output_dir} holds other files (no {RUN_FILE}); choose an empty or new folder.")
    if not resume:
        raise ValueError(
            f"`output_dir` {output_dir} already holds a training run; pass `resume` to continue it (with the arguments "
            f"it was started with, in its {RUN_FILE}), or choose an empty or new folder."
        )
    try:
        recorded = json.loads(run_file.read_text(encoding="utf-8"))
        problem = None if isinstance(recorded, dict) else "JSON, but not an object"
    except ValueError as error:  # not UTF-8, or not JSON
        problem = f"not JSON: {error}"
    if problem is not None:
        raise ValueError(
            f"`resume`: {run_file} is not the record of a run ({problem}); the run in `output_dir` cannot be "
            "checked, so it is not continued. Choose an empty or new folder."
        )
    differences = [] if identity is None else _differences(recorded, identity)
    if differences:
        raise ValueError(
            f"`resume`: the run in `output_dir` {output_dir} had other arguments ({'; '.join(differences)}); "
            "repeat them, or choose an empty or new folder."
        )
    if lock_is_held(output_dir / RUN_LOCK):  # asked on every process: all refuse together, none waits for the others
        raise ValueError(_training_now(output_dir))


@contextlib.contextmanager
def run_lock(output_dir: Path) -> Iterator[None]:
    """Hold the run's lock (:data:`RUN_LOCK`) in ``output_dir`` within the block; ``ValueError`` where another run
    holds it. A run killed leaves the file, not the lock: the system releases it with the process."""
    handle = try_lock(output_dir / RUN_LOCK)
    if handle is None:
        raise ValueError(_training_now(output_dir))
    try:
        yield
    finally:
        os.close(handle)


def _training_now(output_dir: Path) -> str:
    return (
        f"`resume`: another run is training in `output_dir` {output_dir} now (it holds {RUN_LOCK} there); wait for it "
        "to end, or stop it (under accelerate launch its processes may outlive a killed launcher)."
    )


def _no_runs_file(path: Path) -> bool:
    """Whether ``path`` in an output folder is none of a run's files: another run's check folder, or the lock file
    a run killed before its record was written left."""
    return path.name.startswith(CHECK_PREFIX) or path.name == RUN_LOCK


def _differences(recorded: dict[str, Any], identity: dict[str, Any]) -> list[str]:
    """```name`: <there> there, <here> here`` for each differing argument, settings one by one. The model compares
    as a place (``tiny/model`` and its absolute path are one), the method as what it computes (an alias, or a
    default written out, is the same method)."""
    if recorded.get("format") != identity["format"] or not isinstance(recorded.get("settings"), dict):
        return [f"{RUN_FILE} is of another format"]
    there, here = recorded["settings"], identity["settings"]
    pairs = []
    if not (isinstance(recorded.get("model"), str) and same_place(recorded["model"], identity["model"])):
        pairs.append(("model", recorded.get("model"), identity["model"]))
    if not _same_method(recorded.get("method"), identity["method"]):
        pairs.append(("method", recorded.get("method"), identity["method"]))
    weights, loaded = recorded.get("weights"), identity["weights"]
    weights = weights if isinstance(weights, dict) else {}
    other_weights = weights.get("dtype") == loaded["dtype"] and weights.get("fingerprint") != loaded["fingerprint"]
    if weights.get("dtype") != loaded["dtype"]:
        pairs.append(("dtype", weights.get("dtype"), loaded["dtype"]))
    for key in ("bf16", "processes"):  # bf16 as the run trains
        there, here = {**there, key: recorded.get(key)}, {**here, key: identity[key]}
    pairs += [(name, there.get(name), value) for name, value in here.items() if there.get(name) != value]
    said = [f"`{name}`: {old!r} there, {new!r} here" for name, old, new in pairs]
    if other_weights:
        said.append("the model's weights differ (another checkpoint or GGUF file under its name)")
    if recorded.get("data_sha256") != identity["data_sha256"]:
        said.append("the tokens of `texts` differ")
    return said


def _same_method(recorded: Any, now: str) -> bool:
    """Whether a recorded method specification computes what ``now`` does (:meth:`MethodSpec.identity`)."""
    if recorded == now:
        return True
    try:
        return MethodSpec.parse(str(recorded)).identity() == MethodSpec.parse(now).identity()
    except ValueError:
        return False


def last_checkpoint(output_dir: Path, processes: int) -> str | None:
    """The newest checkpoint the Trainer finished writing, or None: its ``trainer_state.json`` (written last by the
    first process) reads as JSON, and the RNG state of each of the run's ``processes`` is whole (each process writes
    its own, the others' maybe after that file). A newer one it did not finish (the run stopped while writing it:
    killed, interrupted, a full disk) is named in a warning and left as it is: the Trainer writes it again when the
    run reaches its step."""
    steps = _checkpoints(output_dir)
    for step in sorted(steps, reverse=True):
        if _finished(steps[step], processes):
            return str(steps[step])
        logger.warning(
            "%s was not finished (the run stopped while writing it): resuming from the checkpoint before it, or from "
            "the start; it is written again at step %d.",
            steps[step],
            step,
        )
    return None


def check_checkpoint_files(checkpoint: str) -> None:
    """Raise ``ValueError`` naming the first of ``checkpoint``'s optimizer and scheduler states (:data:`STATE_FILES`)
    that ``torch.load`` cannot read as tensors and plain values: a truncated file, or a pickle that would run code
    (refused by ``weights_only``, never run). The Trainer would stop on it with a traceback after the run started."""
    for name in STATE_FILES:
        path = Path(checkpoint) / name
        if not path.exists():
            continue
        try:
            torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception as error:  # torch raises RuntimeError, UnpicklingError, EOFError... for a bad file
            reason = next(iter(str(error).strip().splitlines()), type(error).__name__)
            raise ValueError(
                f"`resume`: {path} cannot be read as saved training state ({reason}); nothing was changed. Remove "
                f"{Path(checkpoint).name} to resume from the checkpoint before it, or choose an empty or new folder."
            ) from None


def _checkpoints(output_dir: Path) -> dict[int, Path]:
    """The Trainer's checkpoint folders in ``output_dir`` by step."""
    steps = {}
    for folder in output_dir.glob(f"{PREFIX_CHECKPOINT_DIR}-*"):
        step = folder.name.removeprefix(f"{PREFIX_CHECKPOINT_DIR}-")
        if step.isdigit() and folder.is_dir():
            steps[int(step)] = folder
    return steps


def _finished(checkpoint: Path, processes: int) -> bool:
    rng_files = ["rng_state.pth"] if processes <= 1 else [f"rng_state_{rank}.pth" for rank in range(processes)]
    try:
        json.loads((checkpoint / TRAINER_STATE_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return all(zipfile.is_zipfile(checkpoint / name) for name in rng_files)  # torch.save's zip: its end written last


class _PutBackOnceRead(TrainerCallback):
    """Calls ``put_back`` when training begins, once every process's Trainer has read the checkpoint's config:
    its resume reads the file before ``on_train_begin``, and nothing after."""

    def __init__(self, put_back: Callable[[], None]):
        self.put_back = put_back

    def on_train_begin(self, args, state, control, **kwargs):
        PartialState().wait_for_everyone()  # every process past its read of the trimmed file
        self.put_back()


@contextlib.contextmanager
def readable_by_the_trainer(checkpoint: str, trim: bool) -> Iterator[TrainerCallback]:
    """While the Trainer resumes from ``checkpoint``, its ``config.json`` without the ``rope_scaling`` that
    transformers' generic config class cannot read (``trim``: on the processes that save); the file as it was
    once training begins (the callback this yields, for every process), or when the block ends first.

    The Trainer's resume reads that file with the generic class (only to compare transformers versions), and
    transformers 5.24 raises there on a ``yarn`` or ``llama3`` ``rope_scaling`` (its RoPE standardisation asks the
    generic class for ``max_position_embeddings``). A patch writes the key for transformers 4's readers, which load a
    checkpoint too; the resumed model takes its patch from the record and its weights from the checkpoint. Put back
    before the first step, the file is whole after a run killed while it trains. Killed before (SIGTERM skips every
    ``finally``: torchrun's to the other processes when one fails, a scheduler's pre-emption), the file as it was
    waits beside it (``ORIGINAL_SUFFIX``) and the next resume puts it back first. A file changed meanwhile (the
    checkpoint written again) is left as it is."""
    path = Path(checkpoint) / CONFIG_NAME
    kept = path.with_name(path.name + ORIGINAL_SUFFIX)
    if trim and kept.is_file():  # a resume killed while the file was trimmed
        atomic_write_text(path, kept.read_text(encoding="utf-8"))
        kept.unlink()
    original = _unreadable_rope_scaling(path) if trim else None
    if original is None:
        yield _PutBackOnceRead(lambda: None)
        return
    config = json.loads(original)
    del config["rope_scaling"]
    trimmed = json.dumps(config, indent=2, sort_keys=True) + "\n"
    atomic_write_text(kept, original)
    atomic_write_text(path, trimmed)

    def put_back() -> None:
        with contextlib.suppress(OSError):  # the checkpoint rotated away by save_total_limit: nothing to put back
            if path.read_text(encoding="utf-8") == trimmed:
                atomic_write_text(path, original)
            kept.unlink(missing_ok=True)

    try:
        yield _PutBackOnceRead(put_back)
    finally:
        put_back()


def _unreadable_rope_scaling(path: Path) -> str | None:
    """The text of the config file at ``path`` where it has a ``rope_scaling`` that transformers' generic config
    class raises on; None where the class reads it, or there is no file (the Trainer reads none either)."""
    if not path.is_file():
        return None
    try:
        PreTrainedConfig.from_json_file(str(path))
        return None
    except Exception:  # whatever its RoPE standardisation raises
        text = path.read_text(encoding="utf-8")
    return text if "rope_scaling" in json.loads(text) else None
