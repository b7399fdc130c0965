"""One module per idea of the paper: each analysis is a pure function of a model (and tokens)."""
