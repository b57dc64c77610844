"""Human-readable views of a JobRecord for the terminal (the engines have their own UIs)."""

from __future__ import annotations

from spot_core.model import JobRecord


def attempts_table(record: JobRecord):
    """A rich Table with one row per attempt."""
    from rich.table import Table

    table = Table(title=f"job {record.job_id} ({record.status})")
    for column in ("#", "pool", "market", "outcome", "resumed from", "last ckpt", "cost $",
                   "on-demand $", "lost work h"):
        table.add_column(column, justify="left" if column in ("pool", "outcome") else "right")
    for a in record.attempts:
        table.add_row(str(a.number), f"{a.pool.zone} {a.pool.instance_type}", str(a.pool.market),
                      str(a.outcome), _dash(a.checkpoint_step_start), _dash(a.checkpoint_step_end),
                      f"{a.cost:.2f}", f"{a.on_demand_cost:.2f}",
                      f"{a.lost_work_seconds / 3600:.3f}")
    return table


def ledger_lines(record: JobRecord, time_scale: float = 1.0) -> str:
    ledger = record.ledger
    clock = "" if time_scale == 1 else (f" (capacity time; the local cloud replays 1 s as "
                                        f"{time_scale / 3600:g} h)")
    transfer = (f" (incl. ${ledger.data_transfer_cost:.2f} cross-region data transfer)"
                if ledger.data_transfer_cost > 0 else "")
    return (f"preemptions {record.preemptions}, user failures {record.user_failures}, fallbacks "
            f"to on-demand {record.fallbacks}, resumed from steps "
            f"{record.summary()['resumed_from_steps']}\n"
            f"spot cost ${ledger.spent:.2f}{transfer} vs on-demand ${ledger.on_demand_equivalent:.2f}: saved "
            f"${ledger.saved:.2f} ({ledger.savings_fraction:.0%}); lost work "
            f"{ledger.lost_work_seconds / 3600:.2f} h; checkpoint overhead "
            f"{ledger.checkpoint_overhead_seconds / 3600:.2f} h{clock}")


def print_record(record: JobRecord, time_scale: float = 1.0) -> None:
    from rich.console import Console

    console = Console(highlight=False, width=120)
    console.print(attempts_table(record))
    console.print(ledger_lines(record, time_scale))


def _dash(value) -> str:
    return "-" if value is None else str(value)


def demo_report(engine: str, record: JobRecord, *, final_weights_sha256: str | None,
                uninterrupted_weights_sha256: str, accuracy: float | None) -> dict:
    """The stable JSON object `spot-pipelines demo --json` ends with (DESIGN.md), for
    every engine."""
    summary = record.summary()
    return {
        "engine": engine,
        "attempts": summary["attempts"],
        "preemptions": summary["preemptions"],
        "fallbacks": summary["fallbacks"],
        "resumed_from_steps": summary["resumed_from_steps"],
        "spot_cost": summary["spot_cost"],
        "on_demand_cost": summary["on_demand_cost"],
        "savings_fraction": summary["savings_fraction"],
        "lost_work_seconds": summary["lost_work_seconds"],
        "final_weights_sha256": final_weights_sha256,
        "uninterrupted_weights_sha256": uninterrupted_weights_sha256,
        "accuracy": accuracy,
    }
