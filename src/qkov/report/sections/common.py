"""What several sections share: the colours of a yes/no (red: yes, blue: no), the eigenvalues'
colours (green: positive real part, purple: negative), and a share's format."""

from __future__ import annotations

BLUE, RED = "#1f77b4", "#d62728"
GREEN, PURPLE = "#2ca02c", "#9467bd"  # eigenvalues: positive and negative real part


def share(value: float | None) -> str:
    """A signed share to two decimals, or a dash when undefined."""
    return "—" if value is None else f"{value:+.2f}"
