"""qkov: read the algorithms of small attention-only transformers straight off their weights.

An implementation of "A Mathematical Framework for Transformer Circuits" (Elhage, Nanda, Olsson et
al., Anthropic, 2021). Conventions: row vectors and TransformerLens weight names, so a head writes
``pattern @ x @ W_V @ W_O`` where the paper (column vectors) writes ``W_O W_V x``; the QK circuit
``W_Q W_K^T`` here is the paper's ``W_Q^T W_K``.
"""

from qkov import interop
from qkov.checkpoint import load, save
from qkov.config import Config
from qkov.errors import QkovError
from qkov.linalg import FactoredMatrix, TopK, copying_score, random_copying_scores
from qkov.model import AttnOnlyTransformer

__all__ = [
    "AttnOnlyTransformer",
    "Config",
    "FactoredMatrix",
    "QkovError",
    "TopK",
    "copying_score",
    "interop",
    "load",
    "random_copying_scores",
    "save",
]
