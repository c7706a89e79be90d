"""Independent measurements fanned out over a Ray cluster: a thin pool of Ray actors, each holding one
loaded pair on one device, that run tasks (parts of a benchmark or a sweep) and hand back their rows.

Ray schedules, places and restarts; this module only keeps the queue of tasks: it hands a task to an
idle worker, collects results as they finish (`ray.wait`), puts the task of a worker that died back in
the queue a bounded number of times (on a new worker), and keeps every finished result when the run is
stopped or interrupted. It knows nothing of sweeps or benchmarks: a task is any picklable object with

    label: str                      what the progress bar and the errors call it
    run(pair, kept: dict) -> Any    runs on a worker's pair; `kept` is the worker's own, across tasks
                                    (what the task keeps there: a warm-up done, a float32 copy loaded)

The benchmark (`benchmark.py`) and the sweep (`sweep/runner.py`) split their prompts into such tasks
and merge the results into the rows, summaries and reports a local run writes.

Ray is an optional dependency (the `cluster` extra), imported only when a cluster is used.
"""

from __future__ import annotations

import collections
import math
import os
import socket
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from ...models.spec import PairSpec
from ..suite import prompts_label
from .runners import measured_on

DEFAULT_RETRIES = 2
_SCHEMES = ("ray", "ray://HOST:PORT")
Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class Cluster:
    """Where and how a run fans out.

    address: "ray" (the cluster RAY_ADDRESS names, else a Ray started on this machine) or
    "ray://HOST:PORT" (a remote cluster's client server). workers: how many actors (default: one per
    GPU of the cluster, else one per `cpus_per_worker` CPUs). retries: how many times the task of a
    worker that died goes back to the queue before it counts as failed. prompts_per_task: prompts
    of one task (default: about four tasks per worker). runtime_env: Ray's, for a cluster whose
    nodes lack this package (e.g. {"pip": ["specdemo[cluster]"]})."""

    address: str = "ray"
    workers: int | None = None
    retries: int = DEFAULT_RETRIES
    prompts_per_task: int | None = None
    cpus_per_worker: int = 1
    runtime_env: dict | None = None

    def __post_init__(self) -> None:
        address = self.address.strip() if isinstance(self.address, str) else self.address
        if address != "ray" and not (isinstance(address, str) and address.startswith("ray://")):
            raise ValueError(f"cluster must be {' or '.join(_SCHEMES)}, got {self.address!r}")
        if address.startswith("ray://"):
            _host_port(address)
        object.__setattr__(self, "address", address)
        for name, low in (("workers", 1), ("retries", 0), ("prompts_per_task", 1), ("cpus_per_worker", 1)):
            value = getattr(self, name)
            if value is None and name in ("workers", "prompts_per_task"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"cluster {name} must be an integer ≥ {low}, got {value!r}")

    @classmethod
    def of(cls, value: "Cluster | str") -> "Cluster":
        return value if isinstance(value, Cluster) else cls(value)

    def prompts_for(self, prompts: int, workers: int) -> int:
        """Prompts per task: as asked, else enough tasks for each worker to get about four."""
        return self.prompts_per_task or max(1, math.ceil(prompts / (4 * workers)))


def _host_port(address: str) -> tuple[str, int]:
    """HOST and PORT of "ray://HOST:PORT" or "HOST:PORT" (ValueError naming the address)."""
    rest = address.removeprefix("ray://")
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"cluster address {address!r} is not ray://HOST:PORT (e.g. ray://10.0.0.5:10001)")
    return host, int(port)


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fail now, clearly, where nothing answers at the address: Ray's own client retries for long."""
    host, port = _host_port(address)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as error:
        raise ConnectionError(f"no Ray cluster answers at {address} ({error}); start one there with "
                              "`ray start --head`, or check the host and port") from None


def connect(cluster: Cluster) -> dict[str, float]:
    """Connect to the cluster (a driver already connected keeps its session) and say what it holds."""
    try:
        import ray
    except ImportError:
        raise ImportError("a cluster run needs Ray: pip install 'specdemo[cluster]'") from None
    named = cluster.address if cluster.address != "ray" else os.environ.get("RAY_ADDRESS", "")
    if named and named not in ("auto", "local"):
        _check_reachable(named)
    if not ray.is_initialized():  # a driver that called ray.init itself keeps its session
        try:
            ray.init(address=cluster.address if cluster.address != "ray" else None,
                     runtime_env=cluster.runtime_env, log_to_driver=False)
        except ConnectionError as error:
            raise ConnectionError(f"cannot connect to the Ray cluster at {named or 'this machine'}: {error}") from None
    return ray.cluster_resources()


def worker_plan(resources: dict[str, float], spec: PairSpec, cluster: Cluster) -> tuple[int, dict[str, Any]]:
    """How many workers, and the resources each asks for: a GPU each where the cluster has GPUs
    (and the pair is not pinned to the CPU), else `cpus_per_worker` CPUs each."""
    gpus = int(resources.get("GPU", 0))
    on_gpu = gpus > 0 and (spec.device is None or spec.device.startswith("cuda"))
    room = gpus if on_gpu else int(resources.get("CPU", 0)) // cluster.cpus_per_worker
    what = f"{gpus} GPUs" if on_gpu else f"{int(resources.get('CPU', 0))} CPUs"
    if room < 1 or (cluster.workers is not None and cluster.workers > room):
        raise ValueError(f"the cluster has room for {room} worker(s) ({what}, {cluster.cpus_per_worker} CPU(s) "
                         f"each), not {cluster.workers or 1}")
    options = {"num_gpus": 1, "num_cpus": cluster.cpus_per_worker} if on_gpu else {"num_cpus": cluster.cpus_per_worker}
    return cluster.workers or room, options


class PairWorker:
    """A Ray actor's body: one pair, loaded at its first task on the device Ray gave the actor (its
    GPU, else the CPU) and kept for every later task; a pair that failed to load fails every task."""

    def __init__(self, spec: PairSpec, threads: int | None = None):
        self.spec, self.threads = spec, threads
        self.pair = None
        self.load_error: BaseException | None = None
        self.kept: dict = {}

    def _loaded(self):
        if self.load_error is not None:
            raise self.load_error
        if self.pair is None:
            import ray
            import torch

            if self.threads:
                torch.set_num_threads(self.threads)
            # The GPU Ray gave this worker is its only visible one, cuda; without one, the device asked
            # for (a CPU, or a GPU that is not there: loading says so), else the CPU.
            gpu = bool(ray.get_gpu_ids()) and torch.cuda.is_available()
            try:
                self.pair = replace(self.spec, device="cuda" if gpu else self.spec.device or "cpu").load()
            except Exception as error:
                self.load_error = error
                raise
        return self.pair

    def run(self, task) -> tuple[Any, dict[str, str]]:
        """The task's result, and where it ran (node, device)."""
        pair = self._loaded()
        return task.run(pair, self.kept), measured_on(pair.device)


@dataclass
class TaskFailure:
    index: int  # the task's place in the list given
    label: str
    attempts: int
    reason: str


@dataclass
class PoolOutcome:
    """What came back: each finished task's result by its index, the failed tasks, whether the run
    was stopped (should_stop or an interrupt) before every task finished, and the workers seen."""

    results: dict[int, Any] = field(default_factory=dict)
    failures: list[TaskFailure] = field(default_factory=list)
    stopped: bool = False
    workers: list[dict[str, str]] = field(default_factory=list)  # node and device of each that finished a task
    replaced: int = 0  # workers that died and were replaced


class WorkerPool:
    """Connected to a cluster, with the plan of its workers; `run` starts them for a list of tasks."""

    def __init__(self, spec: PairSpec, cluster: Cluster | str, threads: int | None = None):
        self.spec, self.cluster = spec, Cluster.of(cluster)
        self.threads = threads or self.cluster.cpus_per_worker  # torch's threads on each worker
        self.size, self.options = worker_plan(connect(self.cluster), spec, self.cluster)
        self.name = f"specdemo-worker-{uuid.uuid4().hex[:8]}"
        self._made = 0

    def _new_worker(self):
        import ray

        self._made += 1
        return ray.remote(PairWorker).options(name=f"{self.name}-{self._made}", **self.options).remote(
            self.spec, self.threads)

    def run(self, tasks: Sequence, progress: Progress | None = None,
            should_stop: Callable[[], bool] | None = None) -> PoolOutcome:
        """Every task on the pool, as workers come free; progress(done, total, "node: label") as each ends."""
        import ray

        outcome = PoolOutcome()
        queue = collections.deque(range(len(tasks)))
        attempts: collections.Counter = collections.Counter()
        idle = [self._new_worker() for _ in range(min(self.size, len(tasks)))]
        started = list(idle)  # every worker this run made, killed at its end (a GPU each, freed)
        running: dict = {}

        def feed() -> None:  # every idle worker takes the next task
            while queue and idle:
                index, worker = queue.popleft(), idle.pop()
                running[worker.run.remote(tasks[index])] = (index, worker)

        try:
            while queue or running:
                feed()
                [ref], _ = ray.wait(list(running), num_returns=1)
                index, worker = running.pop(ref)
                attempts[index] += 1
                message = self._collect(ref, index, worker, tasks, attempts[index], outcome, idle, queue, started)
                if message is None:  # back in the queue
                    continue
                feed()  # before the bar moves, so that a worker is never idle while progress runs
                if progress is not None:
                    progress(len(outcome.results) + len(outcome.failures), len(tasks), message)
                if should_stop is not None and should_stop() and (queue or running):
                    outcome.stopped = True
                    break
        except KeyboardInterrupt:  # the driver was interrupted: keep what finished
            outcome.stopped = True
        finally:
            for worker in started:
                ray.kill(worker)
        return outcome

    def _collect(self, ref, index, worker, tasks, attempt, outcome, idle, queue, started) -> str | None:
        """One ended task into the outcome; None where it went back to the queue."""
        import ray
        from ray.exceptions import RayError, RayTaskError

        label = prompts_label(tasks[index].prompts)
        try:
            value, where = ray.get(ref)
        except RayTaskError as error:  # the task raised: the same prompts would raise again
            cause = error.cause if error.cause is not None else error
            outcome.failures.append(TaskFailure(index, label, attempt, f"{type(cause).__name__}: {cause}"))
            idle.append(worker)
            return f"{label} failed"
        except RayError as error:  # the worker died or its node went away: a new worker, the task again
            ray.kill(worker)
            again = attempt <= self.cluster.retries
            if again or queue:  # a new worker where there is work left for it
                started.append(self._new_worker())
                idle.append(started[-1])
                outcome.replaced += 1
            if again:
                queue.appendleft(index)
                return None
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            outcome.failures.append(TaskFailure(index, label, attempt,
                                                f"its worker died {attempt} time(s): {type(error).__name__}: {reason}"))
            return f"{label} failed"
        outcome.results[index] = value
        if where not in outcome.workers:
            outcome.workers.append(where)
        idle.append(worker)
        return f"{where['node']}: {label}"


def run_parts(pair, cluster: Cluster | str, items: Sequence, task_of: Callable[[tuple, tuple[int, ...]], Any],
              progress: Progress | None = None, should_stop: Callable[[], bool] | None = None
              ) -> tuple[list, PoolOutcome, dict[str, Any]]:
    """`items` cut into consecutive parts, each a task (task_of(its items, their indices)), run on a pool of
    workers for the pair: the tasks, what came back, and what a result's meta says of the cluster run."""
    pool = WorkerPool(PairSpec.of(pair), cluster)
    per_task = pool.cluster.prompts_for(len(items), pool.size)
    chunks = [range(start, min(start + per_task, len(items))) for start in range(0, len(items), per_task)]
    tasks = [task_of(tuple(items[i] for i in chunk), tuple(chunk)) for chunk in chunks]
    outcome = pool.run(tasks, progress, should_stop)
    return tasks, outcome, {
        "address": pool.cluster.address, "workers": pool.size, "worker_resources": pool.options,
        "tasks": len(tasks), "finished_tasks": len(outcome.results), "failed_tasks": len(outcome.failures),
        "replaced_workers": outcome.replaced, "measured_on": outcome.workers}
