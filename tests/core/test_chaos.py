"""Chaos across seeds: random preemptions, notice timings, IMDS and store faults.

Each seed derives one whole scenario from ``random.Random(seed)``: the availability
trace of two zones, how long a notice lasts, the budgets, what each attempt's metadata
service does wrong (5xx, revoked tokens, garbage, hangs, from the attempt's start or
from its notice on) and what the checkpoint store does wrong (slow or failing puts on an
``s3://`` store on moto, behind a real failing HTTP proxy that only the nodes go
through). The job runs under the controller on the local cloud, driven as every engine
adapter drives it. Whatever happens, the job must end succeeded (with final weights
bit-identical to an uninterrupted run's) or failed for a reason the scenario allows
(a spent budget it provoked), no attempt may be blamed on the step's own code (it has
no bug), and no lease process may be left. A failure names its seed; rerun it with
``pytest tests/core/test_chaos.py -m slow -k "seed_17"`` (or the quick list).

``make test`` runs a few seeds; ``make test-chaos`` runs many (the ``slow`` marker).
"""

from __future__ import annotations

import functools
import random
import time
from dataclasses import dataclass, field

import pytest

from spot_core.attempt_env import INFRASTRUCTURE_EXIT_CODE, PREEMPTED_EXIT_CODE, step_exit_code
from spot_core.checkpoint import open_store
from spot_core.checkpoint.state import arrays_from_bytes
from spot_core.controller import Controller, JobSpec, Next, classify
from spot_core.errors import CheckpointError, FencedOut, Preempted
from spot_core.localcloud.cloud import LocalCloudConfig
from spot_core.localcloud.server import LocalCloudServer
from spot_core.model import JobStatus, Outcome
from spot_core.policy.retry import RetryPolicy
from spot_core.providers import open_provider
from spot_core.providers.base import LeaseState, LeaseStatus
from spot_core.workloads.softmax_regression import STATE_FILE, TrainConfig, train, weights_sha256
from tests.support.aws_helpers import client, unique
from tests.support.fault_proxy import FaultProxy
from tests.support.spot_helpers import marked_processes, trace, train_command, wait_until

STEPS, STEP_SECONDS, EVERY = 300, 0.01, 60
QUICK_SEEDS = (3, 4, 20, 12)  # file store; failing puts; s3; a sustained outage
SLOW_SEEDS = tuple(range(100, 150))
DRIVE_LIMIT = 150.0
ZONES = ("us-east-1a_v100_1", "us-west-2b_v100_1")


@dataclass(frozen=True)
class ImdsFault:
    """What one attempt's metadata service does wrong, and when (seconds after ``anchor``:
    the lease's start or the first notice the controller saw)."""

    anchor: str  # "start" | "notice"
    offset: float
    kind: str  # "5xx" | "garbage" | "revoke" | "hang"
    duration: float
    status: int = 500


@dataclass(frozen=True)
class StoreFault:
    """Node puts to the store misbehave from ``start`` to ``start + duration`` seconds
    after the job began (``duration`` None: until the job ends)."""

    start: float
    duration: float | None
    mode: str  # "503" | "reset" | "slow"
    delay: float = 0.0


@dataclass(frozen=True)
class Scenario:
    seed: int
    patterns: tuple[str, str]
    tick_seconds: float  # trace seconds per tick; one tick is one wall second
    min_notice: float  # the local cloud's notice floor, wall seconds
    grace: float  # SIGTERM -> SIGKILL at reclaim, wall seconds
    policy: RetryPolicy
    store: str  # "file" | "s3"
    imds: tuple[tuple[ImdsFault, ...], ...]  # per attempt number - 1 (cycled)
    store_faults: tuple[StoreFault, ...] = field(default=())

    @property
    def sustained_outage(self) -> bool:
        return any(f.duration is None and f.mode != "slow" for f in self.store_faults)

    @property
    def failing_puts(self) -> bool:
        return any(f.mode != "slow" for f in self.store_faults)

    def describe(self) -> str:
        return (
            f"seed {self.seed}: zones {self.patterns[0][:14]}../{self.patterns[1][:14]}.. "
            f"tick {self.tick_seconds:g}s notice>={self.min_notice:g}s grace {self.grace:g}s "
            f"store {self.store} faults {self.store_faults} imds {self.imds} {self.policy}"
        )


def availability(rng: random.Random) -> str:
    """Up and down spells, then capacity for good (so a patient job can always finish)."""
    spells = []
    for _ in range(rng.randint(0, 3)):
        spells.append("1" * rng.randint(1, 6) + "0" * rng.randint(1, 5))
    return ("0" * rng.choice((0, 0, 0, 1, 2))) + "".join(spells) + "1" * 600


def imds_faults(rng: random.Random) -> tuple[ImdsFault, ...]:
    faults = []
    for _ in range(rng.choice((0, 1, 1, 2, 3))):
        kind = rng.choice(("5xx", "garbage", "revoke", "hang"))
        anchor = rng.choice(("start", "notice"))
        faults.append(
            ImdsFault(
                anchor=anchor,
                kind=kind,
                offset=round(rng.uniform(0.0, 3.0 if anchor == "start" else 0.6), 2),
                duration=round(rng.uniform(0.2, 3.0), 2),
                status=rng.choice((500, 502, 503)),
            )
        )
    return tuple(faults)


def store_faults(rng: random.Random) -> tuple[StoreFault, ...]:
    roll = rng.random()
    if roll < 0.3:
        return ()
    if roll < 0.45:  # a sustained outage of every node put from early on
        return (
            StoreFault(
                start=round(rng.uniform(0.0, 2.0), 2),
                duration=None,
                mode=rng.choice(("503", "reset")),
            ),
        )
    faults = []
    for _ in range(rng.randint(1, 3)):
        mode = rng.choice(("503", "reset", "slow", "slow"))
        faults.append(
            StoreFault(
                start=round(rng.uniform(0.0, 12.0), 2),
                duration=round(rng.uniform(0.3, 4.0), 2),
                mode=mode,
                delay=round(rng.uniform(0.05, 0.6), 2) if mode == "slow" else 0,
            )
        )
    return tuple(faults)


def scenario(seed: int) -> Scenario:
    """The whole scenario, from the seed alone."""
    rng = random.Random(seed)
    patterns = (availability(rng), availability(rng) if rng.random() < 0.6 else "0" * 600)
    policy = RetryPolicy(
        max_preemptions=rng.randint(0, 4),
        max_infrastructure_retries=rng.randint(1, 3),
        on_demand_fallback=rng.random() < 0.6,
        return_to_spot=rng.random() < 0.5,
        min_on_demand_seconds=rng.choice((0.0, 5.0, 600.0)),
        capacity_wait_seconds=0.5,
        max_capacity_waits=30,
    )
    store = "s3" if rng.random() < 0.6 else "file"
    return Scenario(
        seed=seed,
        patterns=patterns,
        tick_seconds=rng.choice((60.0, 120.0, 240.0, 480.0)),
        min_notice=round(rng.uniform(0.25, 1.5), 2),
        grace=round(rng.uniform(0.3, 1.5), 2),
        policy=policy,
        store=store,
        imds=tuple(imds_faults(rng) for _ in range(4)),
        store_faults=store_faults(rng) if store == "s3" else (),
    )


@functools.lru_cache(maxsize=1)
def uninterrupted_weights() -> str:
    """The same training run in one go, in this process, with no checkpoint at all."""
    return train(TrainConfig(steps=STEPS, seed=7)).weights_sha256


class Chaos:
    """Applies a scenario's faults as the job goes: called between every two driver steps."""

    def __init__(self, scene: Scenario, server: LocalCloudServer, proxy: FaultProxy | None):
        self.scene, self.server, self.proxy = scene, server, proxy
        self.began = time.time()
        self.applied: set[tuple[str, int]] = set()  # (lease id, fault index)

    def tick(self, nxt: Next) -> None:
        now = time.time()
        self._store(now)
        if nxt.action == "watch" and nxt.lease is not None:
            self._imds(nxt, now)

    def _store(self, now: float) -> None:
        if self.proxy is None:
            return
        age = now - self.began
        active = [
            f
            for f in self.scene.store_faults
            if f.start <= age and (f.duration is None or age < f.start + f.duration)
        ]
        self.proxy.mode = active[0].mode if active else None
        self.proxy.delay = active[0].delay if active else 0.0

    def _imds(self, nxt: Next, now: float) -> None:
        lease = nxt.lease
        faults = self.scene.imds[(lease.attempt - 1) % len(self.scene.imds)]
        for index, fault in enumerate(faults):
            anchor = lease.started_at if fault.anchor == "start" else nxt.notice_at
            if (
                anchor is None
                or now < anchor + fault.offset
                or (lease.lease_id, index) in self.applied
            ):
                continue
            self.applied.add((lease.lease_id, index))
            emulator = self.server.cloud.metadata_emulator(lease.lease_id)
            if fault.kind == "revoke":
                emulator.expire_tokens()
            elif fault.kind == "hang":
                emulator.fail_requests(
                    mode="hang", duration=fault.duration, hang_seconds=min(fault.duration, 1.5)
                )
            else:
                emulator.fail_requests(
                    fault.status,
                    mode="status" if fault.kind == "5xx" else "garbage",
                    duration=fault.duration,
                )


def drive(controller: Controller, spec: JobSpec, chaos: Chaos) -> tuple[Next, list[Next]]:
    """The driver loop every engine adapter implements, with the chaos between steps."""
    seen: list[Next] = []
    nxt = controller.advance(spec, controller.persist(controller.new_record(spec)))
    give_up = time.monotonic() + DRIVE_LIMIT
    while nxt.action != "finished" and time.monotonic() < give_up:
        seen.append(nxt)
        chaos.tick(nxt)
        if nxt.action == "sleep":
            while time.time() < nxt.until:
                chaos.tick(nxt)
                time.sleep(min(0.05, max(0.0, nxt.until - time.time())))
            nxt = controller.advance(spec, nxt.record)
        elif nxt.action == "watch":
            time.sleep(0.05)
            nxt = controller.check(spec, nxt)
        else:
            nxt = controller.advance(spec, nxt.record)
    if nxt.action != "finished":  # stop the running attempt before failing the test
        if nxt.record.current_attempt is not None:
            controller.stop(spec, nxt.record, "stopped: the chaos test gave up")
        pytest.fail(f"the job did not settle in {DRIVE_LIMIT:g} s: {seen[-1:]}")
    return nxt, seen


def run_scenario(scene: Scenario, tmp_path, moto_endpoint: str):
    """Run the job of ``scene``; return (final Next, store URI)."""
    traces = [
        trace(zone, pattern, tick_seconds=scene.tick_seconds)
        for zone, pattern in zip(ZONES, scene.patterns, strict=True)
    ]
    config = LocalCloudConfig(
        min_notice_wall_seconds=scene.min_notice, grace_wall_seconds=scene.grace
    )
    env = {"CHAOS_RUN": str(tmp_path)}  # so the lease check finds this test's processes
    if scene.store == "s3":
        bucket = unique("chaos")
        client("s3", moto_endpoint).create_bucket(Bucket=bucket)
        uri = f"s3://{bucket}/job"
    else:
        uri = (tmp_path / "ckpt").as_uri()
    with (
        LocalCloudServer.from_traces(
            traces, time_scale=scene.tick_seconds, workdir=tmp_path / "cloud", config=config
        ) as server,
        FaultProxy(moto_endpoint, methods=("PUT", "POST")) as proxy,
    ):
        if scene.store == "s3":
            env["SPOT_S3_ENDPOINT_URL"] = proxy.url  # the nodes' puts go through the faults
        provider = open_provider("local", url=server.url, workdir=server.cloud.workdir)
        spec = JobSpec(
            f"chaos-{scene.seed}",
            train_command(STEPS, STEP_SECONDS, 7, EVERY),
            uri,
            provider.pools(),
            env=env,
        )
        controller = Controller(
            provider,
            provider.market,
            scene.policy,
            heartbeat_timeout_seconds=None,
            attempt_timeout_seconds=90.0,
            observe_failure_timeout_seconds=10.0,
        )
        final, _ = drive(controller, spec, Chaos(scene, server, proxy))
        proxy.mode = None
    assert wait_until(lambda: not marked_processes(str(tmp_path)), timeout=15), (
        f"{scene.describe()}: a lease process outlived its attempt"
    )
    return final, uri


def allowed_failures(scene: Scenario) -> list[str]:
    """The reasons a job of this scenario may fail for; none other."""
    reasons = []
    if not scene.policy.on_demand_fallback:
        reasons.append("on-demand fallback is off")  # the preemption budget is spent
    if scene.failing_puts:
        reasons.append("infrastructure retries are used up")
    return reasons


def check(scene: Scenario, final: Next, uri: str) -> None:
    record, why = final.record, scene.describe()
    story = "; ".join(
        f"#{a.number} {a.pool.key if a.pool else '-'} {a.outcome} "
        f"[{a.checkpoint_step_start}->{a.checkpoint_step_end}] {a.message[:400]}"
        for a in record.attempts
    )
    why = f"{why}\n  attempts: {story}\n  end: {record.status} {final.reason}"
    assert all(a.outcome is not Outcome.USER_FAILED for a in record.attempts), (
        f"an attempt was blamed on the step's own code, which has no bug:\n{why}"
    )
    assert record.preemptions == sum(a.outcome is Outcome.PREEMPTED for a in record.attempts), why
    if scene.sustained_outage:
        assert record.status is JobStatus.FAILED, f"no checkpoint could be written, yet:\n{why}"
    if record.status is JobStatus.SUCCEEDED:
        store = open_store(uri)
        ref = store.latest()
        assert ref is not None and ref.metadata.get("final") and ref.step == STEPS, why
        weights = weights_sha256(arrays_from_bytes(store.load(ref)[STATE_FILE]))
        assert weights == uninterrupted_weights(), f"final weights differ:\n{why}"
        return
    assert record.status is JobStatus.FAILED, why
    assert any(reason in final.reason for reason in allowed_failures(scene)), (
        f"the job failed for a reason its scenario does not allow:\n{why}"
    )


def run_seed(seed: int, tmp_path, moto_endpoint: str) -> None:
    scene = scenario(seed)
    final, uri = run_scenario(scene, tmp_path, moto_endpoint)
    check(scene, final, uri)


def test_a_store_outage_on_the_node_is_not_the_steps_fault():
    """The exit codes a step ends with, and how the controller reads them back."""
    outage = CheckpointError("S3 put failed: 503", retryable=True)
    assert step_exit_code(outage) == INFRASTRUCTURE_EXIT_CODE
    assert step_exit_code(Preempted("notice")) == PREEMPTED_EXIT_CODE
    assert step_exit_code(FencedOut("stale writer")) is None  # not retryable
    assert step_exit_code(ValueError("the step's own bug")) is None
    ended = LeaseStatus(LeaseState.EXITED, exit_code=INFRASTRUCTURE_EXIT_CODE, ended_at=1.0)
    assert classify(ended) is Outcome.INFRASTRUCTURE_FAILED
    assert (
        classify(LeaseStatus(LeaseState.EXITED, exit_code=1, ended_at=1.0)) is Outcome.USER_FAILED
    )


def test_scenarios_come_from_the_seed_alone():
    assert scenario(5) == scenario(5)
    assert len({scenario(seed) for seed in SLOW_SEEDS}) == len(SLOW_SEEDS)
    kinds = {f.kind for seed in SLOW_SEEDS for per in scenario(seed).imds for f in per}
    modes = {f.mode for seed in SLOW_SEEDS for f in scenario(seed).store_faults}
    assert kinds == {"5xx", "garbage", "revoke", "hang"} and modes == {"503", "reset", "slow"}
    assert any(scenario(seed).sustained_outage for seed in SLOW_SEEDS)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("seed", QUICK_SEEDS, ids=lambda s: f"seed_{s}")
def test_chaos_quick(seed, tmp_path, aws_env):
    run_seed(seed, tmp_path, aws_env)


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("seed", SLOW_SEEDS, ids=lambda s: f"seed_{s}")
def test_chaos_many(seed, tmp_path, aws_env):
    run_seed(seed, tmp_path, aws_env)


# -- batch: units neither lost nor repeated under random reclaims ------------------------------
# Real worker processes share one queue; each seed picks the batch's size and cut, the store
# (file or S3 on moto), whether units checkpoint inside, and when which worker is reclaimed:
# SIGTERM (a notice: progress saved, claim released) or SIGKILL (the lease vanished: the
# claim lapses and is taken over). A reclaimed worker is replaced, as a spot job's next
# attempt would be. The batch must end with every unit done once and the result equal to a
# plain loop's.
BATCH_QUICK_SEEDS = (1, 2, 5)  # 5: S3
BATCH_SLOW_SEEDS = tuple(range(300, 330))


def run_batch_seed(seed: int, tmp_path, moto_endpoint: str) -> None:
    import os
    import signal
    import subprocess
    import sys

    from spot_core.workloads.batch import ItemRange, WorkQueue, outputs_sha256
    from spot_core.workloads.batch_inference import ITEM_SECONDS, infer

    rng = random.Random(seed)
    n_items, unit_size = rng.randint(40, 120), rng.randint(2, 9)
    if seed % 5 == 0:
        bucket = unique("chaos-batch")
        client("s3", moto_endpoint).create_bucket(Bucket=bucket)
        uri = f"s3://{bucket}/batch"
    else:
        uri = (tmp_path / "queue").as_uri()
    every = rng.choice((None, 2))
    queue = WorkQueue.create(
        uri, ItemRange(0, n_items), unit_size=unit_size, claim_timeout_seconds=1.5
    )
    command = [
        sys.executable,
        "-m",
        "spot_core.workloads.batch_worker",
        "--queue",
        uri,
        "--function",
        "spot_core.workloads.batch_inference:infer",
        "--idle-timeout-seconds",
        "60",
    ]
    if every:
        command += ["--checkpoint-every-items", str(every)]
    env = {**os.environ, ITEM_SECONDS: "0.01"}
    spawned = 0

    def spawn() -> subprocess.Popen:
        nonlocal spawned
        spawned += 1
        return subprocess.Popen(
            [*command, "--worker-id", f"w{spawned}"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    workers = [spawn() for _ in range(3)]
    reclaims = rng.randint(2, 5)
    deadline = time.monotonic() + 150
    try:
        for _ in range(reclaims):
            time.sleep(rng.uniform(0.3, 1.5))
            victim = rng.randrange(len(workers))
            workers[victim].send_signal(rng.choice((signal.SIGTERM, signal.SIGKILL)))
            workers[victim].wait(timeout=30)
            # -15: SIGTERM came before the worker set its handler, so before any claim
            assert workers[victim].returncode in (0, 143, -9, -15), (
                f"seed {seed}: a worker failed: {workers[victim].stderr.read()[-2000:]!r}"
            )
            workers[victim] = spawn()
        for worker in workers:
            worker.wait(timeout=max(1.0, deadline - time.monotonic()))
            assert worker.returncode == 0, f"seed {seed}: {worker.stderr.read()[-2000:]!r}"
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    progress = queue.progress()
    why = f"seed {seed}: {n_items} items in units of {unit_size}, every={every}, {uri}"
    assert progress.complete and progress.done == progress.total and not progress.failed, why
    items = sorted(o["item"] for _, outs in queue.outputs() for o in outs)
    assert items == list(range(n_items)), f"lost or repeated items: {why}"
    plain = [(u, [infer(i) for i in queue.spec.unit_items(u)]) for u in queue.spec.unit_ids()]
    assert outputs_sha256(queue.outputs()) == outputs_sha256(plain), why


@pytest.mark.timeout(240)
@pytest.mark.parametrize("seed", BATCH_QUICK_SEEDS, ids=lambda s: f"seed_{s}")
def test_batch_chaos_quick(seed, tmp_path, aws_env):
    run_batch_seed(seed, tmp_path, aws_env)


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("seed", BATCH_SLOW_SEEDS, ids=lambda s: f"seed_{s}")
def test_batch_chaos_many(seed, tmp_path, aws_env):
    run_batch_seed(seed, tmp_path, aws_env)
