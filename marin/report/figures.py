"""A training curve as SVG text (the report's figures/*.svg), deterministic for the same values:
matplotlib's SVG ids are salted with a constant and the date is left out."""

from __future__ import annotations

import io
from typing import Any


def figure_svg(curve: dict[str, Any], key: str, title: str) -> str:
    """One training curve as SVG text, deterministic for the same values; the loss figure
    shows the validation loss beside the training loss."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with matplotlib.rc_context({"svg.hashsalt": "marin-report", "svg.fonttype": "path", "font.size": 9}):
        fig, ax = plt.subplots(figsize=(6.0, 2.6), dpi=100)
        ax.plot(curve["step"], curve[key], color="#d62728", linewidth=1.6, label="training")
        val = [(s, v) for s, v in zip(curve["step"], curve.get("val_loss") or [], strict=False) if v is not None]
        if key == "loss" and val:
            ax.plot([s for s, _ in val], [v for _, v in val], color="#1f77b4", linewidth=1.6, label="validation")
            ax.legend(frameon=False)
        ax.set_xlabel("step")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": "marin report"})
        plt.close(fig)
    return buf.getvalue()
