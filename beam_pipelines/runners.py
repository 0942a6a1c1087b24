"""What the runners retry, and the options that set it. Nothing here imports Dask: a job on the
DirectRunner, Flink or Dataflow starts without it (the DaskRunner itself: beam_pipelines/dask_runner.py).

- DaskRunner (``--runner DaskRunner`` runs beam_pipelines/dask_runner.py's): Beam's runner hands the whole graph
  to ``client.compute`` with dask's default of no retries, so one exception in a task (a unit
  whose write met a store that stayed away past the storage layer's own retries, say) fails the
  run. Here the graph is computed with ``--dask_task_retries`` retries (default 3). A worker
  process that dies is dask's own business: the scheduler recomputes its tasks elsewhere until a
  task has been on ``distributed.scheduler.allowed-failures`` (3) dead workers. With
  ``--slurm_workers N`` the runner submits its own workers as SLURM jobs for the pipeline and
  cancels them after it (beam_pipelines/slurm.py).
- FlinkRunner: a batch job restarts only if the cluster's configuration says so
  (``restart-strategy.type: fixed-delay``, or exponential-delay): without checkpointing Flink
  uses "no restart", and the first failed task (a lost task manager) fails the job. Beam's
  per-job options (``--number_of_execution_retries``, ``--execution_retry_delay``, or a
  restart strategy in ``--flink_conf_dir``) do not reach a batch job of Beam 2.62's Flink runner
  on Flink 1.19 (seen on a real cluster: the job manager logs "NoRestartBackoffTimeStrategy"
  with each of them), so the job says at its start when the cluster would not restart it
  (beam_pipelines/flink.py), and the same command continues a failed run.
- Dataflow retries a failed bundle 4 times (a dead worker uses up an attempt) and then fails the
  job; nothing to set.

Every retry is safe for the jobs: a unit decoded again writes its files under new names and its
completion record last, so nothing is duplicated (paracorpus/commit.py).
"""
from __future__ import annotations

from apache_beam.options.pipeline_options import PipelineOptions

from beam_pipelines.slurm_settings import SlurmOptions  # noqa: F401: registers --slurm_*

DEFAULT_TASK_RETRIES = 3


class TaskRetryOptions(PipelineOptions):
    @classmethod
    def _add_argparse_args(cls, parser):
        parser.add_argument("--dask_task_retries", type=int, default=DEFAULT_TASK_RETRIES,
                            help=f"DaskRunner: times a task that raised is run again before the run fails "
                                 f"(default {DEFAULT_TASK_RETRIES}; Beam's own runner: 0)")


class FlinkRestartOptions(PipelineOptions):
    """Beam's Flink options for a job's restart strategy, known here so that the job's strict
    option check accepts them; Beam passes them to its Flink job server as they are."""

    @classmethod
    def _add_argparse_args(cls, parser):
        parser.add_argument("--number_of_execution_retries", type=int, default=None,
                            help="FlinkRunner: restarts of a failed streaming job (Beam's; its Flink runner ignores it "
                                 "for these batch jobs: the cluster's restart-strategy decides, docs/operations.md)")
        parser.add_argument("--execution_retry_delay", type=int, default=None,
                            help="FlinkRunner: milliseconds between those restarts")
        parser.add_argument("--flink_conf_dir", default=None,
                            help="FlinkRunner: a folder of Flink configuration (config.yaml) the job server applies "
                                 "to this job's client side")
