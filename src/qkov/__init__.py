"""qkov: read the algorithms of transformers (the paper's attention-only models, GPT-2, and today's
open-weight families) straight off their weights.

An implementation of "A Mathematical Framework for Transformer Circuits" (Elhage, Nanda, Olsson et
al., Anthropic, 2021). Conventions: qkov uses row vectors and TransformerLens weight names, so a head writes
``pattern @ x @ W_V @ W_O`` where the paper (column vectors) writes ``W_O W_V x``. Every circuit is
therefore the transpose of the paper's: the OV circuit ``W_V W_O`` here is the paper's
``W_OV = W_O W_V``, the QK circuit ``W_Q W_K^T`` the paper's ``W_QK = W_Q^T W_K``, the full OV
circuit ``W_E W_V W_O W_U`` the paper's ``W_U W_OV W_E``. Each docstring gives both forms.

``import qkov`` is light: each name below is imported from its module when first used (PEP 562),
so that ``qkov --version`` and a mistyped command answer before torch is loaded.
"""

from __future__ import annotations

import importlib
from importlib.metadata import version as _version
from typing import TYPE_CHECKING

# the one version string: pyproject.toml's, as installed (qkov --version prints it)
__version__ = _version("qkov")

# where each public name lives: read on first use by __getattr__ below
_HOMES: dict[str, str] = {
    "load": "qkov.checkpoint",
    "save": "qkov.checkpoint",
    "score_attribution": "qkov.circuits.attribution",
    "score_parts": "qkov.circuits.attribution",
    "ScoreParts": "qkov.circuits.attribution",
    "attribution_patching": "qkov.circuits.attribution_patching",
    "composition": "qkov.circuits.composition",
    "Composition": "qkov.circuits.composition",
    "composition_baseline": "qkov.circuits.composition",
    "composition_scores": "qkov.circuits.composition",
    "k_composition_circuit": "qkov.circuits.composition",
    "k_composition_positivity": "qkov.circuits.composition",
    "compare_copying": "qkov.circuits.copying",
    "Copying": "qkov.circuits.copying",
    "copying_analysis": "qkov.circuits.copying",
    "copying_score": "qkov.circuits.copying",
    "CopyingComparison": "qkov.circuits.copying",
    "direct_copying": "qkov.circuits.copying",
    "DirectCopying": "qkov.circuits.copying",
    "random_copying_scores": "qkov.circuits.copying",
    "group_similarity": "qkov.circuits.groups",
    "GroupSimilarity": "qkov.circuits.groups",
    "induction_mechanisms": "qkov.circuits.mechanisms",
    "InductionMechanism": "qkov.circuits.mechanisms",
    "mlp_logit_terms": "qkov.circuits.neurons",
    "neuron_analysis": "qkov.circuits.neurons",
    "neuron_gates": "qkov.circuits.neurons",
    "neuron_keys": "qkov.circuits.neurons",
    "neuron_logit_contributions": "qkov.circuits.neurons",
    "neuron_logit_effects": "qkov.circuits.neurons",
    "neuron_values": "qkov.circuits.neurons",
    "Neurons": "qkov.circuits.neurons",
    "frozen_patterns": "qkov.circuits.paths",
    "path_expansion": "qkov.circuits.paths",
    "term_importance": "qkov.circuits.paths",
    "TermImportance": "qkov.circuits.paths",
    "virtual_weights": "qkov.circuits.paths",
    "full_ov_circuit": "qkov.circuits.qk_ov",
    "full_qk_circuit": "qkov.circuits.qk_ov",
    "ov_circuit": "qkov.circuits.qk_ov",
    "qk_circuit": "qkov.circuits.qk_ov",
    "qk_term_rms": "qkov.circuits.qk_ov",
    "qk_terms": "qkov.circuits.qk_ov",
    "QKTerms": "qkov.circuits.qk_ov",
    "shared_full_ov_circuit": "qkov.circuits.qk_ov",
    "shared_full_qk_circuit": "qkov.circuits.qk_ov",
    "position_free_qk_circuit": "qkov.circuits.rotary_bands",
    "rotary_bands": "qkov.circuits.rotary_bands",
    "RotaryBands": "qkov.circuits.rotary_bands",
    "head_spectra": "qkov.circuits.spectra",
    "HeadSpectrum": "qkov.circuits.spectra",
    "Config": "qkov.config",
    "QkovError": "qkov.errors",
    "from_hf": "qkov.interop",
    "from_transformer_lens": "qkov.interop",
    "from_weights": "qkov.interop",
    "open_model": "qkov.interop",
    "FactoredMatrix": "qkov.linalg",
    "SharedFactoredMatrix": "qkov.linalg",
    "TopK": "qkov.linalg",
    "AttnOnlyTransformer": "qkov.model",
    "Transformer": "qkov.model",
    "load_results": "qkov.results",
    "Reproduction": "qkov.results",
    "Results": "qkov.results",
}
_SUBMODULES = ("analyze", "interop", "view")  # analyze: the module, callable as qkov.analyze(model)


def __getattr__(name: str) -> object:
    """A public name's object, imported from its module on first use and kept; the first one
    used also installs the notebook views (``_repr_html_``, :mod:`qkov.view`), as importing the
    whole package used to."""
    if name in _SUBMODULES or name in _HOMES:
        importlib.import_module("qkov.view")
    if name in _SUBMODULES:
        value = importlib.import_module(f"qkov.{name}")
    elif name in _HOMES:
        value = getattr(importlib.import_module(_HOMES[name]), name)
    else:
        raise AttributeError(f"module 'qkov' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # what a type checker and an IDE read: the same names, imported eagerly
    from qkov import analyze, interop, view
    from qkov.checkpoint import load, save
    from qkov.circuits.attribution import ScoreParts, score_attribution, score_parts
    from qkov.circuits.attribution_patching import attribution_patching
    from qkov.circuits.composition import (
        Composition,
        composition,
        composition_baseline,
        composition_scores,
        k_composition_circuit,
        k_composition_positivity,
    )
    from qkov.circuits.copying import (
        Copying,
        CopyingComparison,
        DirectCopying,
        compare_copying,
        copying_analysis,
        copying_score,
        direct_copying,
        random_copying_scores,
    )
    from qkov.circuits.groups import GroupSimilarity, group_similarity
    from qkov.circuits.mechanisms import InductionMechanism, induction_mechanisms
    from qkov.circuits.neurons import (
        Neurons,
        mlp_logit_terms,
        neuron_analysis,
        neuron_gates,
        neuron_keys,
        neuron_logit_contributions,
        neuron_logit_effects,
        neuron_values,
    )
    from qkov.circuits.paths import (
        TermImportance,
        frozen_patterns,
        path_expansion,
        term_importance,
        virtual_weights,
    )
    from qkov.circuits.qk_ov import (
        QKTerms,
        full_ov_circuit,
        full_qk_circuit,
        ov_circuit,
        qk_circuit,
        qk_term_rms,
        qk_terms,
        shared_full_ov_circuit,
        shared_full_qk_circuit,
    )
    from qkov.circuits.rotary_bands import RotaryBands, position_free_qk_circuit, rotary_bands
    from qkov.circuits.spectra import HeadSpectrum, head_spectra
    from qkov.config import Config
    from qkov.errors import QkovError
    from qkov.interop import from_hf, from_transformer_lens, from_weights, open_model
    from qkov.linalg import FactoredMatrix, SharedFactoredMatrix, TopK
    from qkov.model import AttnOnlyTransformer, Transformer
    from qkov.results import Reproduction, Results, load_results

__all__ = [
    "analyze",
    "attribution_patching",
    "AttnOnlyTransformer",
    "Composition",
    "composition",
    "Config",
    "Copying",
    "CopyingComparison",
    "DirectCopying",
    "FactoredMatrix",
    "HeadSpectrum",
    "InductionMechanism",
    "Neurons",
    "QKTerms",
    "QkovError",
    "Reproduction",
    "Results",
    "ScoreParts",
    "SharedFactoredMatrix",
    "TermImportance",
    "Transformer",
    "TopK",
    "compare_copying",
    "composition_baseline",
    "composition_scores",
    "copying_analysis",
    "copying_score",
    "direct_copying",
    "from_hf",
    "from_transformer_lens",
    "from_weights",
    "group_similarity",
    "GroupSimilarity",
    "open_model",
    "position_free_qk_circuit",
    "rotary_bands",
    "RotaryBands",
    "frozen_patterns",
    "full_ov_circuit",
    "full_qk_circuit",
    "head_spectra",
    "induction_mechanisms",
    "interop",
    "k_composition_circuit",
    "k_composition_positivity",
    "load",
    "load_results",
    "mlp_logit_terms",
    "neuron_analysis",
    "neuron_gates",
    "neuron_keys",
    "neuron_logit_contributions",
    "neuron_logit_effects",
    "neuron_values",
    "ov_circuit",
    "path_expansion",
    "qk_circuit",
    "qk_term_rms",
    "qk_terms",
    "random_copying_scores",
    "save",
    "score_attribution",
    "score_parts",
    "shared_full_ov_circuit",
    "shared_full_qk_circuit",
    "term_importance",
    "view",
    "virtual_weights",
]
