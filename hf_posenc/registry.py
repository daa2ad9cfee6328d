"""Method registry: name -> :class:`Method`, with aliases. Registering a name twice is an error."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

FrequencyFn = Callable[..., "tuple[torch.Tensor, float]"]
TransformersRopeFn = Callable[[Any, int, float], "dict[str, Any] | None"]


def _required(item: dataclasses.Field) -> bool:
    """A parameter without a default."""
    return item.default is dataclasses.MISSING and item.default_factory is dataclasses.MISSING


@dataclass(frozen=True)
class Method:
    """A position-encoding method: its parameters, its math and how transformers can say it.

    Attributes:
        name (`str`): canonical name (``"yarn"``).
        params (`type`): frozen, keyword-only dataclass of the method's parameters; validates in
            ``__post_init__``.
        frequencies (`Callable`, *optional*): RoPE methods' pure math, ``fn(params, *, head_dim, base,
            seq_len, dtype, device) -> (inv_freq, attention_factor)``; ``inv_freq`` has ``head_dim // 2``
            entries. ``None`` for methods that replace RoPE rather than rescale it (ALiBi).
        transformers_rope (`Callable`, *optional*): ``fn(params, head_dim, base) -> rope_parameters`` in
            transformers' own vocabulary (without ``rope_theta`` unless the method changes it), or ``None`` (the
            function, or its result for some parameters) where transformers cannot express the method.
        dynamic (`bool`): the frequencies depend on the current sequence length.
        depends_on_length (`bool`, defaults to `True`): the output at a position may depend on the input's
            total length, not only on the tokens up to it (dynamic methods; LongRoPE switches factors at
            ``L``). When `False`, the first ``n`` positions of one forward are exactly a forward of the first
            ``n`` tokens, so evaluation reads every shorter window from the longest. Defaults to the safe
            answer: a method must say it does not.
        unchanged_within_context (`bool`): for ``seq_len <= original_max_position_embeddings`` the
            method is the unpatched model exactly (dynamic NTK, dynamic YaRN).
        applies_to (`frozenset[str]`): position kinds it patches (``"rope"``, ``"learned"``).
        role (`str`): what it changes, which says what it combines with (:func:`combine`): ``"rope"`` (the
            rotary frequencies), ``"remap"`` (the positions attention sees: Self-Extend, DCA), ``"temperature"``
            (a per-position query scale: log-n), ``"replace"`` (the whole encoding: ALiBi; combines with nothing).
        parts (`tuple[Method, ...]`): the methods a combination (``"yarn+logn"``) is made of; empty otherwise.
        adds_parameters (`bool`): the patch adds parameters (the T5 table), which the saved weights hold.
        filled_in (`Callable`, *optional*): ``fn(name, value) -> bool``, whether a parameter's recorded value is
            the one ``patch`` fills in for the model where it is not given (ALiBi's paper slopes for the model's
            heads), which a saved model's method spec then leaves out.
        paper (`str`): reference, shown in errors, the README and model cards.
        summary (`str`): one line on when to use it.
    """

    name: str
    params: type
    frequencies: FrequencyFn | None = None
    transformers_rope: TransformersRopeFn | None = None
    dynamic: bool = False
    depends_on_length: bool = True
    unchanged_within_context: bool = False
    applies_to: frozenset[str] = frozenset({"rope"})
    role: str = "rope"
    parts: tuple[Method, ...] = ()
    adds_parameters: bool = False
    filled_in: Callable[[str, Any], bool] | None = field(default=None, compare=False)
    aliases: tuple[str, ...] = ()
    paper: str = ""
    summary: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"Method {self.name!r}: role {self.role!r} is not one of {', '.join(ROLES)}.")
        if self.dynamic and not self.depends_on_length:
            raise ValueError(f"Method {self.name!r} is dynamic, so its output depends on the input's length.")

    @property
    def param_names(self) -> list[str]:
        """The names of its parameters, in the params dataclass's order."""
        return [item.name for item in dataclasses.fields(self.params)]

    def own(self, params: dict[str, Any]) -> dict[str, Any]:
        """The entries of ``params`` that are this method's parameters (a combination's, for one part)."""
        return {key: value for key, value in params.items() if key in self.param_names}

    @property
    def components(self) -> tuple[Method, ...]:
        """The methods it is made of: a combination's parts, else itself."""
        return self.parts or (self,)

    def part(self, role: str) -> Method | None:
        """The component with ``role`` (``"rope"``, ``"remap"``, ...), or None."""
        return next((component for component in self.components if component.role == role), None)

    def make_params(self, **kwargs: Any) -> Any:
        """Build (and so validate) the parameters; unknown names raise with the valid ones listed."""
        names = self.param_names
        unknown = sorted(set(kwargs) - set(names))
        if unknown:
            valid = f"Valid parameters: {', '.join(names)}." if names else f"{self.name!r} takes no parameters."
            raise TypeError(f"Unknown parameter(s) {', '.join(map(repr, unknown))} for method {self.name!r}. {valid}")
        missing = [item.name for item in dataclasses.fields(self.params) if _required(item) and item.name not in kwargs]
        if missing:
            raise TypeError(
                f"Method {self.name!r}: {', '.join(map(repr, missing))} must be given ({self.name}:{missing[0]}=... "
                f"in a method spec, {missing[0]}=... in patch). Valid parameters: {', '.join(names)}."
            )
        try:
            return self.params(**kwargs)
        except TypeError as error:  # a value of the wrong type
            message = str(error).rstrip(".")
            raise TypeError(f"Method {self.name!r}: {message}. Valid parameters: {', '.join(names)}.") from None


def with_context(params: Any, context: int) -> Any:
    """``params`` (a method's, built) with its trained context ``L`` (``original_max_position_embeddings``) set to
    ``context``, and what depends on it resolved: its dataclass builds again with it. ``params`` itself where it
    holds that ``L`` already."""
    if params.original_max_position_embeddings == context:
        return params
    return dataclasses.replace(params, original_max_position_embeddings=context)


def params_to_dict(params: Any) -> dict[str, Any]:
    """A method's params dataclass as JSON-ready values (tuples become lists)."""
    values = {item.name: getattr(params, item.name) for item in dataclasses.fields(params)}
    return {key: list(value) if isinstance(value, tuple) else value for key, value in values.items()}


ROLES = ("rope", "remap", "temperature", "replace", "combination")
COMBINES = ("rope", "remap", "temperature")  # the roles a combination may hold, one method each, in this order
_METHODS: dict[str, Method] = {}
_ALIASES: dict[str, str] = {}


def register(method: Method) -> Method:
    """Add ``method`` under its name and aliases; a name already taken raises ``ValueError``."""
    for name in (method.name, *method.aliases):
        if name in _METHODS or name in _ALIASES:
            raise ValueError(f"Method name {name!r} is already registered.")
    _METHODS[method.name] = method
    _ALIASES.update({alias: method.name for alias in method.aliases})
    return method


def get_method(name: str) -> Method:
    """The registered method called ``name`` (or an alias of it)."""
    if not isinstance(name, str):
        raise TypeError(f"A method name must be a string, got {type(name).__name__}: {name!r}.")
    if ":" in name:  # a method spec (the command line's --method), not a name
        hint = _SPEC_HINT.format(name=name.partition(":")[0])
        raise ValueError(f"Unknown method {name!r}.{hint} Available methods: {', '.join(available_methods())}.")
    if "+" in name:
        return combine(*(get_method(part) for part in name.split("+")))
    key = name.strip().lower().replace("_", "-")
    key = _ALIASES.get(key, key)
    if key not in _METHODS:
        raise ValueError(f"Unknown method {name!r}. Available methods: {', '.join(available_methods())}.")
    return _METHODS[key]


_SPEC_HINT = (
    " 'name:param=value' is a method spec (the command line's --method); patch takes the name and the parameters"
    " apart: patch(model, {name!r}, param=value)."
)


def available_methods() -> list[str]:
    """Canonical names of all registered methods, sorted."""
    return sorted(_METHODS)


def methods_for(kind: str) -> list[str]:
    """Names of the methods that patch position encodings of ``kind`` (``"rope"``, ``"learned"``)."""
    return sorted(name for name, method in _METHODS.items() if kind in method.applies_to)


def combine(*methods: Method) -> Method:
    """The combination of ``methods`` (``get_method("yarn+logn")``): at most one of each role in
    :data:`COMBINES` (a RoPE scaling, a remap, a temperature), named in that order whatever order they were
    given in, so ``"logn+yarn"`` is ``"yarn+logn"``. Its parameters are all of the parts' (a name two parts
    share, such as the trained context, is one parameter for both); a part's own checks apply. A RoPE scaling that
    changes with the length does not combine with a remap, which re-rotates cached keys: refused here, for any model.
    """
    if len(methods) < 2:
        raise ValueError("A combination names at least two methods, e.g. 'yarn+logn'.")
    roles = [method.role for method in methods]
    refused = [method.name for method in methods if method.role not in COMBINES]
    if refused:
        raise ValueError(
            f"Method(s) {', '.join(map(repr, refused))} combine with nothing; a combination is at most one RoPE "
            f"scaling ({', '.join(_names_of('rope'))}), one remap ({', '.join(_names_of('remap'))}) and one "
            f"temperature ({', '.join(_names_of('temperature'))})."
        )
    twice = sorted({role for role in roles if roles.count(role) > 1})
    if twice:
        names = [method.name for method in methods if method.role in twice]
        raise ValueError(f"{' and '.join(map(repr, names))} both change the {twice[0]}; a combination has one of each.")
    dynamic = [method.name for method in methods if method.role == "rope" and method.dynamic]
    if dynamic and "remap" in roles:
        raise ValueError(
            f"{dynamic[0]!r} changes the frequencies with the length, and a remap re-rotates cached keys with the "
            "current ones; combine Self-Extend or DCA with a static scaling (pi, ntk, yarn, llama3)."
        )
    return _combination(tuple(sorted(methods, key=lambda method: COMBINES.index(method.role))))


def _names_of(role: str) -> list[str]:
    return sorted(name for name, method in _METHODS.items() if method.role == role)


@functools.cache
def _combination(parts: tuple[Method, ...]) -> Method:
    return Method(
        name="+".join(part.name for part in parts),
        params=_combined_params(parts),
        dynamic=any(part.dynamic for part in parts),
        depends_on_length=any(part.depends_on_length for part in parts),
        applies_to=frozenset.intersection(*(part.applies_to for part in parts)),
        role="combination",
        parts=parts,
        paper="; ".join(part.paper for part in parts),
        summary=" + ".join(part.summary for part in parts),
    )


def _combined_params(parts: tuple[Method, ...]) -> type:
    """A frozen dataclass with every part's parameters; building it builds (so checks) each part's, which
    ``part_params`` then returns, and each value is the part's own after its checks (``4`` -> ``4.0``)."""
    fields: dict[str, tuple[Any, dataclasses.Field]] = {}
    for part in parts:
        for item in dataclasses.fields(part.params):
            if item.name in fields and _default(fields[item.name][1]) != _default(item):
                raise ValueError(f"Methods of {[p.name for p in parts]} disagree on the default of {item.name!r}.")
            fields.setdefault(item.name, (item.type, item))

    def __post_init__(self) -> None:
        built = []
        for part in parts:
            built.append(part.make_params(**{name: getattr(self, name) for name in part.param_names}))
        for params in reversed(built):  # the first part holding a name gives its value
            for name, value in vars(params).items():
                if name in fields:
                    object.__setattr__(self, name, value)
        object.__setattr__(self, "part_params", tuple(built))

    return dataclasses.make_dataclass(
        "".join(part.params.__name__.removesuffix("Params") for part in parts) + "Params",
        [(name, kind, _copy_field(item)) for name, (kind, item) in fields.items()],
        namespace={"__post_init__": __post_init__},
        frozen=True,
        kw_only=True,
    )


def _default(item: dataclasses.Field) -> Any:
    return item.default if item.default_factory is dataclasses.MISSING else item.default_factory()


def _copy_field(item: dataclasses.Field) -> dataclasses.Field:
    if item.default is not dataclasses.MISSING:
        return field(default=item.default)
    if item.default_factory is not dataclasses.MISSING:
        return field(default_factory=item.default_factory)
    return field()
