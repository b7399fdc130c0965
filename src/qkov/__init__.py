"""qkov: read the algorithms of small attention-only transformers straight off their weights.

An implementation of "A Mathematical Framework for Transformer Circuits" (Elhage, Nanda, Olsson et
al., Anthropic, 2021). Conventions: qkov uses row vectors and TransformerLens weight names, so a head writes
``pattern @ x @ W_V @ W_O`` where the paper (column vectors) writes ``W_O W_V x``. Every circuit is
therefore the transpose of the paper's: the OV circuit ``W_V W_O`` here is the paper's
``W_OV = W_O W_V``, the QK circuit ``W_Q W_K^T`` the paper's ``W_QK = W_Q^T W_K``, the full OV
circuit ``W_E W_V W_O W_U`` the paper's ``W_U W_OV W_E``. Each docstring gives both forms.
"""

from qkov import interop
from qkov.checkpoint import load, save
from qkov.circuits.composition import (
    composition_baseline,
    composition_scores,
    k_composition_circuit,
    k_composition_positivity,
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
)
from qkov.config import Config
from qkov.errors import QkovError
from qkov.interop import from_hf, from_transformer_lens
from qkov.linalg import FactoredMatrix, TopK, copying_score, random_copying_scores
from qkov.model import AttnOnlyTransformer, Transformer

__all__ = [
    "AttnOnlyTransformer",
    "Config",
    "FactoredMatrix",
    "QKTerms",
    "QkovError",
    "TermImportance",
    "Transformer",
    "TopK",
    "composition_baseline",
    "composition_scores",
    "copying_score",
    "from_hf",
    "from_transformer_lens",
    "frozen_patterns",
    "full_ov_circuit",
    "full_qk_circuit",
    "interop",
    "k_composition_circuit",
    "k_composition_positivity",
    "load",
    "ov_circuit",
    "path_expansion",
    "qk_circuit",
    "qk_term_rms",
    "qk_terms",
    "random_copying_scores",
    "save",
    "term_importance",
    "virtual_weights",
]
