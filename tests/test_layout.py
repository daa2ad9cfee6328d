"""The package's shape: which layer may import which, file sizes, one record type, one version, registrations."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest
import transformers
from tiny_models import make_tiny
from transformers.modeling_rope_utils import RotaryEmbeddingConfigMixin

import hf_posenc
from hf_posenc._version import __version__

PACKAGE = Path(hf_posenc.__file__).parent
PLANNERS = {
    "hf_posenc.patching.rope",
    "hf_posenc.patching.bias",
    "hf_posenc.patching.attention_level",
    "hf_posenc.patching.learned",
    "hf_posenc.patching.encodings",
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str) -> set[str]:
    """The hf_posenc modules ``name`` imports, ``from x import y`` resolved to the submodule ``x.y`` where
    one exists, else to ``x`` (a name defined in ``x``'s ``__init__``)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return {module for module in found if module.split(".")[0] == "hf_posenc"}


def test_planners_never_import_each_other():
    for planner in PLANNERS:
        assert not _imports(planner) & (PLANNERS - {planner}), planner


def test_only_the_cli_tune_and_eval_itself_import_eval():
    for name in MODULES:
        if name.startswith(("hf_posenc.cli", "hf_posenc.eval", "hf_posenc.tuning")):
            continue
        assert not {m for m in _imports(name) if m.startswith("hf_posenc.eval")}, name


def test_no_module_imports_the_public_api_from_the_package_root():
    """Lower layers import what they use from where it lives, never from ``hf_posenc/__init__``."""
    for name in MODULES:
        if name != "hf_posenc":
            assert "hf_posenc" not in _imports(name), name


# The rooms of the package, lowest first: a room imports only rooms of lower layers (and itself), so no import
# climbs back and no two rooms import each other. The public face (``hf_posenc/__init__``) and the command line sit
# on top.
LAYERS = (
    {"_version", "_startup", "files", "fields", "offline"},  # the core, in the order its modules import each other
    {"registry"},
    {"spec"},
    {"record", "architectures"},
    {"methods"},
    {"attention"},
    {"patching"},
    {"reports"},  # the typed reports, which the figures draw
    {"plots", "serving"},
    {"hub"},
    {"eval", "training"},
    {"tuning"},
    {"cli", "__init__"},
    {"__main__"},
)


def _room(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _layer(room: str) -> int:
    return next(index for index, rooms in enumerate(LAYERS) if room in rooms)


def test_every_room_has_a_layer_and_imports_only_lower_ones():
    for name in MODULES:
        room = _room(name)
        for imported in _imports(name):
            other = _room(imported)
            if other != room:
                assert _layer(other) < _layer(room), f"{name} imports {imported}: {room} -> {other}"


def test_the_top_level_holds_the_core_and_the_wings():
    """At most 12 modules directly in ``hf_posenc/`` (the core); every other concern is a subpackage, and no two
    modules share a base name."""
    top = sorted(path.stem for path in PACKAGE.glob("*.py"))
    assert len(top) <= 12, top
    assert set(top) <= set().union(*LAYERS[:4]) | {"__init__", "__main__"}, top
    stems = [path.stem for path in PACKAGE.rglob("*.py") if path.stem != "__init__"]
    assert sorted({stem for stem in stems if stems.count(stem) > 1}) == []


def test_functions_are_short():
    """No function over 60 lines, its docstring and signature aside: split by concern, not by a line cap."""
    long = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                body = node.body
                documented = isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant)
                first = body[1].lineno if documented and len(body) > 1 else body[0].lineno
                if node.end_lineno - first + 1 > 60:
                    long.append(f"{name}.{node.name}")
    assert long == []


def test_one_record_type_reads_and_writes_the_config_entry():
    """No module but record.py reads the ``hf_posenc`` entry by hand: the others go through PatchRecord."""
    for name, path in MODULES.items():
        if name != "hf_posenc.record":
            text = path.read_text()
            assert 'hf_posenc["' not in text and "hf_posenc['" not in text, name
            assert "CONFIG_KEY]" not in text and "CONFIG_KEY, None" not in text and "record[" not in text, name


def test_the_version_is_written_once():
    assert hf_posenc.__version__ == __version__
    for name, path in MODULES.items():
        if name != "hf_posenc._version":
            assert "__version__ =" not in path.read_text(), name
    assert 'dynamic = ["version"]' in (PACKAGE.parent / "pyproject.toml").read_text()


def test_registrations_add_to_registries_and_change_no_transformers_class():
    from transformers import AttentionInterface
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    assert {"hf_posenc", "hf_posenc_dynamic"} <= set(
        ROPE_INIT_FUNCTIONS
    ) and "hf_posenc_alibi" not in ROPE_INIT_FUNCTIONS
    assert "hf_posenc_alibi_sdpa" in AttentionInterface._global_mapping
    assert not [name for name in vars(RotaryEmbeddingConfigMixin) if "hf_posenc" in name]
    assert not [name for name in vars(transformers.PreTrainedConfig) if "hf_posenc" in name]


@pytest.mark.parametrize("method", ["dynamic-yarn", "alibi"])
def test_a_saved_config_of_hf_posencs_own_rope_types_loads_without_a_warning(method, tmp_path, caplog):
    """transformers has no validation function for hf_posenc's rope types (none is added to its class); the
    "Missing validation function" line it would log for them is filtered, and nothing else."""
    hf_posenc.patch(make_tiny("llama"), method).save_pretrained(tmp_path)
    transformers.logging.enable_propagation()
    try:
        with caplog.at_level(logging.WARNING):
            transformers.AutoConfig.from_pretrained(tmp_path)
            logging.getLogger("transformers.modeling_rope_utils").warning(
                "Missing validation function in 'RotaryEmbeddingConfigMixin' for 'rope_type'='other'"
            )
    finally:
        transformers.logging.disable_propagation()
    assert {record.getMessage() for record in caplog.records if record.name.startswith("transformers")} == {
        "Missing validation function in 'RotaryEmbeddingConfigMixin' for 'rope_type'='other'"
    }


def test_the_public_names_are_listed_once_each_with_the_module_that_defines_them():
    """``hf_posenc.__all__`` (what ``from hf_posenc import *`` and the docs read) names what the package exports."""
    assert set(hf_posenc.__all__) == {"__version__", *hf_posenc._EXPORTS, *hf_posenc._ON_USE}
    for name in hf_posenc.__all__:
        assert getattr(hf_posenc, name) is not None, name
