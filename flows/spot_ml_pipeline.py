"""The example ML pipeline on spot capacity, for Prefect (the same pipeline as the DAG).

prepare data -> train (on spot: preempted, checkpointed, resumed) -> evaluate.

Two ways to run the training step, one per deployment style:

* ``spot_ml_pipeline``: the flow runs anywhere; its task runner (``SpotTaskRunner``)
  launches the training step as a spot job. Only tasks tagged ``spot`` go to spot.
  ``make demo ENGINE=prefect`` runs this one.
* ``spot_ml_pipeline_on_worker``: the whole flow run is launched on spot capacity by a
  ``spot`` work pool's worker (see ``flows/prefect.yaml``); the training step is a
  ``spot_task`` that checkpoints in place, and when the capacity is reclaimed the worker
  reschedules the flow run, which resumes from the checkpoint.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, task

from prefect_spot import SpotConfiguration, SpotTaskRunner, spot_record, spot_task

# Where the pipeline starts in the shipped real trace (us-east-2a loses capacity about
# 4 s in, us-west-2b about 16 s in, at one trace hour per second): the demo's timing.
DEMO_SPOT = SpotConfiguration(
    provider_options={"start_tick": 450, "time_scale": 3600.0},
    max_preemptions=2,
    capacity_wait=0.5,
    poll_interval=0.1,
    max_capacity_waits=20,
    min_on_demand="365d",
)
CHECKPOINT_EVERY_SECONDS = 0.25  # Young/Daly for this trace's interruption rate, in wall s


@task
def prepare_data(workdir: str) -> str:
    from spot_core.workloads.softmax_regression import TrainConfig, prepare_dataset

    return str(prepare_dataset(TrainConfig(), Path(workdir) / "data" / "dataset.npz"))


def train_model(data: str, steps: int, step_seconds: float, checkpointer=None) -> dict:
    """The training step: resumes from the checkpointer's store, leaves the final weights
    there (``final: true``) for the evaluation step."""
    from spot_core.workloads.softmax_regression import TrainConfig, train

    result = train(TrainConfig(steps=steps, step_seconds=step_seconds), checkpointer, Path(data))
    return {
        "weights_sha256": result.weights_sha256,
        "checkpoint_uri": checkpointer.store.uri,
        "resumed_from_step": result.resumed_from_step,
        "checkpoint_saves": result.checkpoint_saves,
    }


train_on_spot = task(train_model, name="train", tags=["spot"], retries=1)
train_in_place = spot_task(
    train_model,
    name="train",
    retries=1,
    max_preemptions=3,
    checkpoint_every=CHECKPOINT_EVERY_SECONDS,
)


@task
def evaluate_model(checkpoint_uri: str, data: str) -> dict:
    from spot_core.checkpoint import open_store
    from spot_core.workloads.softmax_regression import evaluate

    sha, accuracy = evaluate(open_store(checkpoint_uri), Path(data))
    return {"final_weights_sha256": sha, "accuracy": accuracy}


@flow(
    name="spot-ml-pipeline",
    task_runner=SpotTaskRunner(
        DEMO_SPOT, spot_tag="spot", checkpoint_every=CHECKPOINT_EVERY_SECONDS
    ),
)
def spot_ml_pipeline(workdir: str, steps: int = 2000, step_seconds: float = 0.01) -> dict:
    data = prepare_data(workdir)
    training = train_on_spot.submit(data, steps, step_seconds)
    trained = training.result()
    record = spot_record(training)
    evaluation = evaluate_model(trained["checkpoint_uri"], data)
    return {
        **evaluation,
        "training": trained,
        "record": None if record is None else record.to_dict(),
    }


@flow(name="spot-ml-pipeline-on-worker")
def spot_ml_pipeline_on_worker(workdir: str, steps: int = 2000, step_seconds: float = 0.01) -> dict:
    data = prepare_data(workdir)
    trained = train_in_place(data, steps, step_seconds)
    return {**evaluate_model(trained["checkpoint_uri"], data), "training": trained}


if __name__ == "__main__":
    import tempfile

    print(spot_ml_pipeline(tempfile.mkdtemp(prefix="spot-ml-pipeline-")))
