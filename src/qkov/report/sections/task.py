"""The model on the user's own task: its loss and accuracy, and each head ablated."""

from __future__ import annotations

from qkov.report.markup import table
from qkov.report.sections.ablation import ablation_modes
from qkov.report.svg import esc
from qkov.results import Results


def task_section(r: Results) -> str:
    task = r.task
    if task is None:
        return ""
    rows = [[a.head, a.mode, a.loss, a.loss_change, a.accuracy, a.accuracy_change] for a in task.ablations]
    return (
        "<h3>The model on its own task</h3>"
        + f"<p>On {esc(task.data)}: loss {task.loss:.4f} nats, accuracy {task.accuracy:.4f}, mean "
        f"probability of the target {task.mean_target_probability:.4f}, over the {task.positions} "
        f"position(s) with a target in {task.sequences} sequence(s).</p>"
        + table(["head", "ablation", "loss", "loss change", "accuracy", "accuracy change"], rows)
        + f"<p class='small'>Each head's write ablated on this data "
        f"({ablation_modes(a.mode for a in task.ablations)}): a loss that rises and an accuracy that "
        "falls say the task needs the head.</p>"
    )
