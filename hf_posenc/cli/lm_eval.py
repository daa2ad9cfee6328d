"""``hf-posenc lm-eval``: lm-evaluation-harness tasks on a model and each method, lm-eval's own options passed
through. They are parsed by ``lm-eval run``'s own parser, built when the command runs: lm_eval is imported only
then, so the command is listed (and says what to install) without it."""

from __future__ import annotations

import argparse
import math
from typing import Any

from ..eval.defaults import DEFAULT_METHODS
from ..files import default_output
from ..hub.reach import cache_only_if_unreachable
from ..reports.tasks import LM_EVAL_JSON
from .model_options import add_dtype_argument, add_loading_arguments, model_source_of

# Library parameters, and the options that set them here.
PARAMETER_FLAGS = {
    "methods": "--method",
    "model": "--model",
    "gguf_file": "--gguf-file",
    "revision": "--revision",
    "attn_implementation": "--attn-implementation",
    "device_map": "--device-map",
    "max_memory": "--max-memory",
    "dtype": "--dtype",
    "device": "--device",
    "model_args": "--model_args",
    "tasks": "--tasks",
    "max_length": "--model_args max_length=N",
    "include_path": "--include_path",
    "batch_size": "--batch_size",
    "num_fewshot": "--num_fewshot",
    "output": "--output",
}
# lm-eval run's options that do not apply here, and why.
REFUSED = {
    "config": "give the options on the command line",
    "output_path": "results go to --output (lm_eval.json)",
    "log_samples": "hf-posenc lm-eval does not write samples (yet); run lm-eval itself for them",
    "predict_only": "hf-posenc lm-eval does not write samples (yet); run lm-eval itself for them",
    "trust_remote_code": "hf-posenc never runs code from a model or dataset repo",
    "confirm_run_unsafe_code": "hf-posenc never runs code from a task, model or dataset repo",
    "show_config": "run lm-eval itself to see its configuration",
    "wandb_args": "log to W&B with lm-eval itself",
    "wandb_config_args": "log to W&B with lm-eval itself",
    "trackio_args": "log to Trackio with lm-eval itself",
    "hf_hub_log_args": "push lm-eval's results with lm-eval itself",
}

EPILOG = f"""\
Every lm-eval run option above applies as `lm-eval run` reads it (--tasks, --num_fewshot, --limit, --batch_size,
--include_path, --metadata, --gen_kwargs, --apply_chat_template, --seed, ...); its --config, --output_path,
--log_samples, --predict_only, --show_config, --trust_remote_code, --confirm_run_unsafe_code and logging options
(W&B, Trackio, Hub) are refused. --model_args go to
lm-eval's HFLM (add_bos_token=True, truncation=True, ...), and two to hf-posenc: tokenizer=NAME (default: the
model's) and max_length=N. hf-posenc loads the model (--model, --gguf-file, --revision, --attn-implementation,
--dtype, --device, --device-map, --max-memory): HFLM's loading arguments (revision=, parallelize=, dtype=, ...)
are refused, as HFLM would ignore them for the model it is handed.

One max_length for every method: N, else the longest context a patched config declares (yarn:factor=4 on a model
trained on L tokens: 4L), so that none reads the same tokens as the methods. lm-eval cuts longer inputs to it;
dynamic methods, ALiBi and DCA declare L: pass max_length to go past it. lm-eval pads a batch to its longest input:
a method that depends on the input's length (dynamic-ntk, dynamic-yarn) scores exactly with --batch_size 1.

The metadata gets pretrained=<the tokenizer's name> (what RULER sizes its prompts with), as lm-eval run
--model_args pretrained=... gives it, unless it names a tokenizer (needed for a GGUF file).

default methods: {" and ".join(DEFAULT_METHODS)} (a model saved or pushed patched: none = its base, and its method).
--output gets {LM_EVAL_JSON} (each method's task metrics, the resolved method, lm-eval's version) after every method.

examples:
  hf-posenc lm-eval --model Qwen/Qwen2.5-0.5B --method none --method yarn:factor=4 --tasks niah_single_1 \\
      --metadata '{{"max_seq_lengths": [4096, 16384]}}' --output runs/qwen-yarn
  hf-posenc lm-eval --model ./my-model --include_path ./my_tasks --tasks my_task --limit 100 --batch_size 4
"""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``lm-eval``: it takes every argument as it comes (no ``-`` option here) and parses them itself."""
    command = subparsers.add_parser(
        "lm-eval",
        help="lm-evaluation-harness tasks (RULER, LongBench, ...) on the model and each method",
        prefix_chars="+",
        add_help=False,
    )
    command.add_argument("argv", nargs=argparse.REMAINDER)
    command.set_defaults(
        func=lm_eval_command,
        parameter_flags=PARAMETER_FLAGS,
        interrupted="interrupted: the methods finished are in {output}/" + LM_EVAL_JSON + " (a rerun does not "
        "resume: give it another --output).",
    )


def build_parser() -> tuple[argparse.ArgumentParser, set[str]]:
    """hf-posenc's model options and ``lm-eval run``'s own (lm_eval imported here), and the destinations of the
    latter."""
    from ..eval.harness import import_lm_eval

    import_lm_eval()
    from lm_eval._cli.run import Run

    holder = argparse.ArgumentParser().add_subparsers()
    Run.create(holder)
    run = holder.choices["run"]
    parser = argparse.ArgumentParser(
        prog="hf-posenc lm-eval",
        description="Run lm-evaluation-harness tasks on a model, unpatched (none) and patched with each --method.",
        parents=[run],
        add_help=False,
        conflict_handler="resolve",  # --model / -M are hf-posenc's
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ours = parser.add_argument_group("hf-posenc")
    ours.add_argument("--model", "-M", help="Hub id or local folder (default: the offline SmolLM2-135M-Instruct GGUF)")
    ours.add_argument("--gguf-file", help="GGUF file name inside --model")
    add_loading_arguments(ours)
    add_dtype_argument(ours)
    ours.add_argument(
        "--method", action="append", dest="methods", metavar="SPEC", help="repeatable; 'none' = unpatched"
    )
    ours.add_argument("--output", help="results folder (default: hf-posenc-results/lm-eval-<model>)")
    for action in parser._actions:  # accepted, to refuse them with a reason, and not offered
        if action.dest in REFUSED:
            action.help = argparse.SUPPRESS
    return parser, {action.dest for action in run._actions} - {"model", "help"}


def lm_eval_command(args: argparse.Namespace) -> int:
    from ..eval.harness import LmEvalConfig, run_lm_eval

    try:
        parser, lm_eval_options = build_parser()
    except ImportError as error:
        if {"-h", "--help"} & set(args.argv):  # what the command is, and how to get it, before it is installed
            print(f"usage: hf-posenc lm-eval --tasks TASK[,TASK] [--model MODEL] [--method SPEC ...] ...\n\n{error}")
            return 0
        raise ValueError(str(error)) from None
    parsed = parser.parse_args(args.argv)
    for option, reason in REFUSED.items():
        if getattr(parsed, option, None):
            raise ValueError(f"--{option} does not apply to hf-posenc lm-eval: {reason}.")
    if not parsed.tasks:
        parser.error("the following arguments are required: --tasks")
    if not all(str(task).strip() for task in parsed.tasks):
        raise ValueError(f"--tasks names an empty task ({','.join(map(str, parsed.tasks))!r}); give task names.")
    if parsed.limit is not None and not 0 < parsed.limit < math.inf:  # NaN too
        raise ValueError(
            "--limit must be a finite number > 0 (examples per task, or a fraction of them below 1), "
            f"not {parsed.limit:g}."
        )
    from lm_eval.config.evaluate_config import EvaluatorConfig

    config = EvaluatorConfig.from_cli(
        argparse.Namespace(**{k: getattr(parsed, k) for k in lm_eval_options if k in parsed})
    )
    model_args = dict(parsed.model_args or {})
    if config.max_batch_size:
        model_args["max_batch_size"] = config.max_batch_size
    tokenizer = model_args.pop("tokenizer", None)
    settings = LmEvalConfig(
        config.tasks,
        methods=parsed.methods,
        batch_size=config.batch_size,
        model_args=model_args,
        include_path=config.include_path,
        metadata=config.metadata,
        evaluate=evaluate_arguments(config),
    )
    output = args.output = parsed.output or default_output("lm-eval", parsed.gguf_file or parsed.model or "smollm2")
    with cache_only_if_unreachable(parsed.model, parsed.revision):  # a cached model, at once offline
        report = run_lm_eval(model_source_of(parsed), settings, output, tokenizer=tokenizer, device=parsed.device)
    print(f"\nlm-eval {report.lm_eval_version}, max_length {report.max_length}:")
    print(report.table())
    print(f"\nResults: {output}/{LM_EVAL_JSON}")
    return 0


def evaluate_arguments(config: Any) -> dict[str, Any]:
    """The :func:`lm_eval.simple_evaluate` arguments ``lm-eval run`` derives from its config (the model's aside)."""
    cache = config.cache_requests
    seed = config.seed or [None] * 4
    return {
        "num_fewshot": config.num_fewshot,
        "limit": config.limit,
        "samples": config.samples,
        "use_cache": config.use_cache,
        "cache_requests": cache.get("cache_requests", False),
        "rewrite_requests_cache": cache.get("rewrite_requests_cache", False),
        "delete_requests_cache": cache.get("delete_requests_cache", False),
        "check_integrity": config.check_integrity,
        "write_out": config.write_out,
        "system_instruction": config.system_instruction,
        "apply_chat_template": config.apply_chat_template,
        "fewshot_as_multiturn": config.fewshot_as_multiturn,
        "gen_kwargs": config.gen_kwargs or None,
        "verbosity": config.verbosity,
        "random_seed": seed[0],
        "numpy_random_seed": seed[1],
        "torch_random_seed": seed[2],
        "fewshot_random_seed": seed[3],
        "confirm_run_unsafe_code": config.confirm_run_unsafe_code,
    }
