"""Findings -> a self-contained HTML report (inline SVG figures, no network). It renders results;
it computes nothing."""

from qkov.report.page import render_report

__all__ = ["render_report"]
