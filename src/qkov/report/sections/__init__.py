"""One report section per analysis, each rendering its typed result (:mod:`qkov.results`) and
nothing else: no thresholds, no computation beyond formatting. Captions are written from the data
they describe. :data:`SECTIONS` lists them in page order, keyed by the ``Results`` field they show.
"""

from __future__ import annotations

from collections.abc import Callable

from qkov.report.sections.ablation import ablation_modes, ablation_section
from qkov.report.sections.ablation_estimate import ESTIMATES_SHOWN, ablation_estimate_section
from qkov.report.sections.attention import attention_figure, attention_section
from qkov.report.sections.bigrams import bigram_section
from qkov.report.sections.circuit import circuit_section
from qkov.report.sections.claims import claims_section
from qkov.report.sections.common import BLUE, GREEN, PURPLE, RED
from qkov.report.sections.composition import composition_section
from qkov.report.sections.copying import copying_comparison_section, copying_direct_section, copying_section
from qkov.report.sections.correction import correction_section
from qkov.report.sections.header import NORMALIZATIONS, SOURCES, model_header
from qkov.report.sections.heads import heads_section
from qkov.report.sections.induction_check import induction_section
from qkov.report.sections.mechanisms import induction_mechanism_section
from qkov.report.sections.neurons import NEURON_TOKENS_SHOWN, neurons_section
from qkov.report.sections.position_content import position_content_section
from qkov.report.sections.rotary import gqa_groups_section, rotary_bands_section
from qkov.report.sections.skip_trigrams import skip_trigram_section
from qkov.report.sections.skipped import skipped_section
from qkov.report.sections.spectra import spectra_section
from qkov.report.sections.steps import steps_section
from qkov.report.sections.task import task_section
from qkov.report.sections.term_importance import term_importance_section
from qkov.report.sections.training import phase_change_section, training_section
from qkov.results import Results

# Page order; keyed by the Results field each one shows ("heads" joins copying and repeated_tokens).
SECTIONS: dict[str, Callable[[Results], str]] = {
    "training": training_section,
    "bigram": bigram_section,
    "repeated_tokens": heads_section,
    "spectra": spectra_section,
    "copying": copying_section,
    "copying_direct": copying_direct_section,
    "copying_comparison": copying_comparison_section,
    "skip_trigrams": skip_trigram_section,
    "attention_examples": attention_section,
    "qk_position_content": position_content_section,
    "composition": composition_section,
    "induction_check": induction_section,
    "induction_mechanism": induction_mechanism_section,
    "correction": correction_section,
    "circuit": circuit_section,
    "ablation": ablation_section,
    "neurons": neurons_section,
    "ablation_estimate": ablation_estimate_section,
    "term_importance": term_importance_section,
    "task": task_section,
    "rotary_bands": rotary_bands_section,
    "gqa_groups": gqa_groups_section,
    "steps": steps_section,
    "skipped": skipped_section,
}

__all__ = [
    "SECTIONS",
    "BLUE",
    "ESTIMATES_SHOWN",
    "GREEN",
    "NEURON_TOKENS_SHOWN",
    "NORMALIZATIONS",
    "PURPLE",
    "RED",
    "SOURCES",
    "ablation_estimate_section",
    "ablation_modes",
    "ablation_section",
    "attention_figure",
    "attention_section",
    "bigram_section",
    "circuit_section",
    "claims_section",
    "composition_section",
    "copying_comparison_section",
    "copying_direct_section",
    "copying_section",
    "gqa_groups_section",
    "rotary_bands_section",
    "correction_section",
    "heads_section",
    "induction_mechanism_section",
    "induction_section",
    "model_header",
    "neurons_section",
    "phase_change_section",
    "position_content_section",
    "skip_trigram_section",
    "skipped_section",
    "spectra_section",
    "steps_section",
    "task_section",
    "term_importance_section",
    "training_section",
]
