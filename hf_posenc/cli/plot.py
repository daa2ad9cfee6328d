"""``hf-posenc plot frequencies|bias``: draw what position encodings do, from the library's own math (no model run)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..files import nearest_existing
from ..spec import MethodSpec, format_method_spec

if TYPE_CHECKING:
    from ..plots.encoding_data import TrainedT5Table

KINDS = ("frequencies", "bias")
DEFAULT_SPECS = {
    "frequencies": ("pi:factor=4", "ntk:factor=4", "ntk-by-parts:factor=4", "yarn:factor=4", "llama3:factor=4"),
    "bias": ("alibi", "t5-bias", "sinusoidal", "rope", "yarn:factor=4"),
}
DEFAULTS = {"head_dim": 64, "base": 10000.0, "trained_context": 4096, "num_heads": 8}
DEFAULT_MAX_DISTANCE = 4096
BIAS_ONLY = ("num_heads", "max_distance_shown")
BUCKETING = ("num_buckets", "max_distance")

_WITHOUT_MODEL = "head_dim {head_dim}, base {base:g}, trained context {trained_context}, {num_heads} heads".format(
    **DEFAULTS
)
EPILOG = f"""\
frequencies: for each RoPE scaling, theta_i / theta_i' (how much it divides the frequency of rotary pair i;
1 = kept, s = interpolated like PI) against lambda_i / L (the pair's unscaled wavelength 2 pi / theta_i over
the trained context L), with the attention factor in the legend; dynamic methods are drawn at --seq-len
(default: factor x L). Default methods: {" ".join(DEFAULT_SPECS["frequencies"])}.

bias: what each encoding adds to the attention score against the relative distance n = 0 .. --max-distance,
a panel per kind: ALiBi's -m_h n and the T5 bias table at the start of training (its init, ALiBi-like by
default; first, middle and last head), the sinusoidal PE(p).PE(p+n) / (d/2) (d = heads x head_dim) and, for
RoPE and its scalings, RoFormer's relative upper bound (1/(d/2)) sum_j |S_j| (§3.4.3). 'rope' or 'none' is
RoPE as trained. Default methods: {" ".join(DEFAULT_SPECS["bias"])}.

Without --model: {_WITHOUT_MODEL}. With --model, those of
its config (read without weights; a model saved or pushed patched: its base's); a flag given overrides either.
A model saved patched with t5-bias (hf-posenc train) shows its trained table in the bias plot, with the bucketing it
was saved with where a t5-bias --method gives none (a spec with another bucketing shows that init instead).
Writes frequencies.png and frequencies.csv, or bias.png and bias.csv (the plotted numbers), to --output.

examples:
  hf-posenc plot frequencies
  hf-posenc plot frequencies --method yarn:factor=4 --method llama3:factor=8 --head-dim 128 --base 5e5 \\
      --trained-context 8192 --output plots/
  hf-posenc plot frequencies --model Qwen/Qwen2.5-0.5B --method yarn:factor=4 --method dynamic-ntk:factor=4
  hf-posenc plot bias --method alibi --method t5-bias --method sinusoidal --method rope --num-heads 8 \\
      --head-dim 64 --max-distance 4096 --output plots/
"""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``plot``; its ``func`` is :func:`plot_command`."""
    plot = subparsers.add_parser(
        "plot",
        help="draw what position encodings do (frequencies of RoPE scalings, score bias by distance)",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    plot.add_argument("kind", choices=KINDS, help="frequencies: RoPE scalings per pair; bias: score by distance")
    plot.add_argument(
        "--method",
        action="append",
        dest="specs",
        metavar="SPEC",
        help="repeatable: 'name' or 'name:key=value,...' (default: see below)",
    )
    plot.add_argument("--model", help="Hub id or local folder whose config gives the numbers below (no weights)")
    plot.add_argument("--head-dim", type=int, help="rotary dimension d (default: the model's, else 64)")
    plot.add_argument("--base", type=float, help="RoPE base, rope_theta (default: the model's, else 10000)")
    plot.add_argument("--trained-context", type=int, help="trained context L (default: the model's, else 4096)")
    plot.add_argument("--seq-len", type=int, help="length l dynamic methods are drawn at (default: factor x L)")
    plot.add_argument("--num-heads", type=int, help="bias: attention heads (default: the model's, else 8)")
    plot.add_argument(
        "--max-distance",
        type=int,
        dest="max_distance_shown",
        help=f"bias: largest distance drawn (default: {DEFAULT_MAX_DISTANCE})",
    )
    plot.add_argument("--output", type=Path, help="folder for the plot and its CSV (default: hf-posenc-results/plot)")
    plot.set_defaults(func=plot_command)


def plot_command(args: argparse.Namespace) -> int:
    from ..plots.encoding_figures import write_bias_plot, write_frequency_plot

    given = [name for name in BIAS_ONLY if getattr(args, name) is not None]
    if args.kind == "frequencies" and given:
        raise ValueError(
            f"{' and '.join(f'`{name}`' for name in given)} {'is' if len(given) == 1 else 'are'} for 'plot bias' only."
        )
    from_model = model_geometry(args.model) if args.model else {}
    if args.kind == "frequencies" and args.model and "base" not in from_model and args.base is None:
        raise ValueError(
            f"`model` {args.model} has no rotary embeddings (no rope_theta); its frequencies would be drawn at the "
            f"default base {DEFAULTS['base']:g}. Give `base` to draw them anyway, or plot its 'bias'."
        )
    geometry = {**DEFAULTS, **from_model}
    geometry.update({key: getattr(args, key) for key in DEFAULTS if getattr(args, key) is not None})
    specs = args.specs or list(DEFAULT_SPECS[args.kind])
    output = args.output or Path("hf-posenc-results") / "plot"
    existing = nearest_existing(output)
    if not existing.is_dir():
        raise ValueError(f"`output` {output} names the folder for the plot and its CSV, and {existing} is a file.")
    rope = {key: geometry[key] for key in ("head_dim", "base", "trained_context")}
    if args.kind == "frequencies":
        paths = write_frequency_plot(output, specs, seq_len=args.seq_len, **rope)
    else:
        distance = DEFAULT_MAX_DISTANCE if args.max_distance_shown is None else args.max_distance_shown
        heads, seq_len = geometry["num_heads"], args.seq_len
        table = trained_t5_table(args.model) if args.model else None
        specs = [with_bucketing_of(table, spec) for spec in specs] if table is not None else specs
        shown = dict(max_distance_shown=distance, num_heads=heads, seq_len=seq_len, t5_table=table)
        paths = write_bias_plot(output, specs, **shown, **rope)
    shown = {**rope, **({"num_heads": geometry["num_heads"]} if args.kind == "bias" else {})}
    source = f", from {args.model}'s config and the flags" if args.model else ""
    print(f"{args.kind} of {', '.join(specs)} ({', '.join(f'{k} {v:g}' for k, v in shown.items())}{source})")
    print(f"Plot: {paths[0]}\nData: {paths[1]}")
    return 0


def trained_t5_table(name: str) -> TrainedT5Table | None:
    """The T5 bias table of a model saved patched with ``t5-bias`` (trained: ``hf-posenc train``), read from its
    checkpoint, with its bucketing; None for any other model."""
    from ..hub.saved import saved_patch
    from ..patching.bias import T5_TABLE
    from ..patching.loading import read_checkpoint_tensors
    from ..plots.encoding_data import TrainedT5Table

    saved = saved_patch(name)
    if saved is None or saved.record.method != "t5-bias":
        return None
    names = [f"{prefix}.{T5_TABLE}.weight" for prefix in ("model", "transformer")]
    table = next(iter(read_checkpoint_tensors(name, names).values()), None)
    if table is None:
        return None
    bucketing = {key: saved.record.params[key] for key in BUCKETING}
    return TrainedT5Table(table, **bucketing)


def with_bucketing_of(table: TrainedT5Table, spec: str) -> str:
    """``spec``, a ``t5-bias`` one taking the saved model's ``num_buckets`` and ``max_distance`` where it does not
    give them, so that its curves are the trained table's; any other spec as it is."""
    parsed = MethodSpec.parse(spec)
    if parsed.method != "t5-bias":
        return spec
    return format_method_spec(parsed.name, {**{key: getattr(table, key) for key in BUCKETING}, **parsed.params})


def model_geometry(name: str) -> dict[str, Any]:
    """``head_dim`` (rotary), ``base``, ``trained_context`` and ``num_heads`` of the model ``name``'s config (its
    base's, for a model saved or pushed patched); a model without RoPE (GPT-2) has no ``base``."""
    from ..architectures import rotary_dim
    from ..eval.models import reachable_saved_patch, trained_context
    from ..hub.saved import base_config

    config = base_config(name, reachable_saved_patch(name, weights=False))
    rope = getattr(config, "rope_parameters", None) or {}
    geometry = {"trained_context": trained_context(config), "num_heads": config.num_attention_heads}
    if "rope_theta" not in rope:
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return {**geometry, "head_dim": head_dim}
    return {**geometry, "head_dim": rotary_dim(config), "base": rope["rope_theta"]}
