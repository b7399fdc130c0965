"""qkov: read the algorithms of transformers (the paper's attention-only models, GPT-2, and today's
open-weight families) straight off their weights.

An implementation of "A Mathematical Framework for Transformer Circuits" (Elhage, Nanda, Olsson et
al., Anthropic, 2021). Conventions: qkov uses row vectors and TransformerLens weight names, so a head writes
``pattern @ x @ W_V @ W_O`` where the paper (column vectors) writes ``W_O W_V x``. Every circuit is
therefore the transpose of the paper's: the OV circuit ``W_V W_O`` here is the paper's
``W_OV = W_O W_V``, the QK circuit ``W_Q W_K^T`` the paper's ``W_QK = W_Q^T W_K``, the full OV
circuit ``W_E W_V W_O W_U`` the paper's ``W_U W_OV W_E``. Each docstring gives both forms.
"""

from importlib.metadata import version as _version

from qkov import analyze, interop, view  # analyze: the module, callable as qkov.analyze(model)
from qkov.checkpoint import load, save
from qkov.circuits.attribution import ScoreParts, score_attribution, score_parts
from qkov.circuits.attribution_patching import attribution_patching
from qkov.circuits.composition import (
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

# the one version string: pyproject.toml's, as installed (qkov --version prints it)
__version__ = _version("qkov")

__all__ = [
    "analyze",
    "attribution_patching",
    "AttnOnlyTransformer",
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
