"""Human-readable views of a finished run: the interruption table and the loss curve (with the validation loss, where
the run evaluated) with events marked."""

from __future__ import annotations

from pathlib import Path

from spotray.accounts.cost import money_text
from spotray.config import AUTO


def format_table(summary: dict) -> str:
    """The interruptions (if any) as a table, then the run's result in one line."""
    lines = [*_event_table(summary["events"]), ""] if summary["events"] else []
    exactly_once = summary.get("exactly_once")
    audit = "not audited" if exactly_once is None else "yes" if exactly_once else "NO"
    every = summary["checkpoint_every_steps"]
    interval = ("auto (Young–Daly)" if every == AUTO else "interval unknown" if every is None else
                f"every {every} steps")
    final_loss = "not recorded" if summary["final_loss"] is None else f"{summary['final_loss']:.4f}"
    lines.append(f"goodput {100 * summary['goodput']:.1f}% | every sample exactly once: {audit} | "
                 f"final loss {final_loss} at step {summary.get('final_loss_step', summary['final_step'])} | "
                 f"checkpoint {interval}"
                 f"{_val_loss_cell(summary)}")
    return "\n".join(lines)


def _val_losses(summary: dict) -> dict[int, float]:
    """step -> val loss of the run's evaluations (``summary["evals"]``, absent in a summary of an older spotray)."""
    evals = summary.get("evals") or {}
    losses = {int(step): metrics.get("val_loss") for step, metrics in evals.items()}
    return {step: float(value) for step, value in sorted(losses.items()) if value is not None}


def _val_loss_cell(summary: dict) -> str:
    """`` | val loss X at step S (best S2: Y)``: the last evaluation, and the best checkpoint kept (or, where no
    checkpoint has a val loss, the lowest evaluation); empty where the run never evaluated."""
    losses = _val_losses(summary)
    if not losses:
        return ""
    last = max(losses)
    best = summary.get("best")
    if best is None:
        step = min(losses, key=lambda s: (losses[s], s))
        best = {"step": step, "val_loss": losses[step]}
    return (f" | val loss {losses[last]:.4f} at step {last} "
            f"(best {best['step']}: {best['val_loss']:.4f})")


def format_summary(summary: dict) -> str:
    """``spotray train``'s closing lines."""
    newest = summary["checkpoints"][-1] if summary["checkpoints"] else "none committed"  # oldest first
    speed = f", {summary['tokens_per_s']:,.0f} tokens/s" if summary["tokens_per_s"] is not None else ""
    return "\n".join([f"spotray: done: {summary['run_name']} at step {summary['final_step']}{speed}",
                      format_table(summary),
                      *([f"spotray: cost: {money_text(summary['cost'])}"] if summary.get("cost") else []),
                      f"spotray: checkpoints: {len(summary['checkpoints'])} kept, the newest {newest}"])


def _event_table(events: list[dict]) -> list[str]:
    rows = [("ending", "step", "lost steps (at most)", "resumed from", "resumed after")]
    for e in events:
        recovery = f"{e['recovery_s']:.1f} s" if e["recovery_s"] is not None else "-"
        bound = "" if e["lost_steps_at_most"] == e["lost_steps"] else f" ({e['lost_steps_at_most']})"
        source = f"{e['resumed_from']} ({'snapshot' if e['from_snapshot'] else 'checkpoint'})"
        rows.append((e["kind"], str(e["step"]), f"{e['lost_steps']}{bound}", source, recovery))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths,
                                                                                                     strict=True)))
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def plot_losses(summary: dict, path: str) -> str:
    """The final model's loss history, its validation loss where it evaluated, and a vertical line per
    interruption. Returns the path."""
    import logging

    import matplotlib

    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = sorted(int(s) for s in summary["losses"])
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    ax.plot(steps, [summary["losses"][str(s)] for s in steps], color="#1f77b4", linewidth=1.2, label="training loss")
    val_losses = _val_losses(summary)
    if val_losses:
        ax.plot(list(val_losses), list(val_losses.values()), color="#9467bd", linewidth=1.2, marker="o",
                markersize=3.5, label="val loss")
    colors = {"notice": "#2ca02c", "kill": "#d62728", "error": "#ff7f0e", "node_lost": "#8c564b"}
    for event in summary["events"]:
        ax.axvline(event["step"], color=colors.get(event["kind"], "gray"), linestyle="--", linewidth=1)
        if event["lost_steps"]:
            ax.axvspan(event["resumed_from"], event["step"], color=colors.get(event["kind"], "gray"), alpha=0.15)
        ax.annotate(f"{event['kind']} @ {event['step']}\n{event['lost_steps']} lost", (event["step"], 1.0),
                    xycoords=("data", "axes fraction"), xytext=(4, -28), textcoords="offset points", fontsize=8)
    ax.set_xlabel("step")
    ax.set_ylabel("loss" if val_losses else "training loss")
    if val_losses:
        ax.legend(loc="upper right", fontsize=8)
    ax.set_title(f"{summary['run_name']}: goodput {100 * summary['goodput']:.0f}%, "
                 f"{sum(1 for e in summary['events'] if e['spot'])} spot interruptions")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
