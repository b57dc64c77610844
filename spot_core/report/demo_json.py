"""The stable JSON object `spot-pipelines demo --json` ends with (DESIGN.md)."""

from __future__ import annotations

from typing import Any

from spot_core.model import JobRecord


def demo_report(
    engine: str,
    record: JobRecord,
    *,
    final_weights_sha256: str | None,
    uninterrupted_weights_sha256: str,
    accuracy: float | None,
) -> dict[str, Any]:
    """The same keys for every engine."""
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
        "time_to_resume_seconds": summary["time_to_resume_seconds"],
        "final_weights_sha256": final_weights_sha256,
        "uninterrupted_weights_sha256": uninterrupted_weights_sha256,
        "accuracy": accuracy,
    }
