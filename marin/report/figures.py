"""The report's figures (figures/*.svg) as SVG text: a training curve, a sweep's validation loss;
deterministic for the same values (matplotlib's SVG ids are salted with a constant, the date left out)."""

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


def sweep_svg(s: dict[str, Any]) -> str:
    """The validation loss of each trial of sweep ``s`` (:mod:`marin.report.experiments`) against its
    first swept param; a cross marks a failed trial."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [t["plot"] for t in s["trials"] if isinstance(t["plot"]["x"], int | float) and t["plot"]["y"] is not None]
    with matplotlib.rc_context({"svg.hashsalt": "marin-report", "svg.fonttype": "path", "font.size": 9}):
        fig, ax = plt.subplots(figsize=(4.2, 2.6), dpi=100)
        for failed, marker, color, label in ((False, "o", "#1f77b4", "succeeded"), (True, "x", "#d62728", "failed")):
            xy = sorted((p["x"], p["y"]) for p in pts if p["failed"] is failed)
            if xy:
                ax.plot([x for x, _ in xy], [y for _, y in xy], marker=marker, linestyle="-" if not failed else "",
                        color=color, label=label)
        xs = [p["x"] for p in pts]
        if min(xs) > 0 and max(xs) / min(xs) >= 10:
            ax.set_xscale("log")
        ax.set_xlabel(s["param"])
        ax.set_ylabel("validation loss")
        ax.legend(frameon=False)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": "marin report"})
        plt.close(fig)
    return buf.getvalue()
