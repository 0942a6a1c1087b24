"""Beam's DaskRunner with task retries (``--runner DaskRunner``; what it retries and why:
beam_pipelines/runners.py), and with ``--slurm_workers N`` its workers as SLURM jobs of its own
(beam_pipelines/slurm.py). A module of its own so that only a Dask run imports Dask."""
from __future__ import annotations

from apache_beam.runners.dask import dask_runner
from apache_beam.runners.runner import PipelineState

from beam_pipelines.runners import TaskRetryOptions
from beam_pipelines.slurm import close_cluster, start_cluster
from beam_pipelines.slurm_settings import settings_from


class DaskRunner(dask_runner.DaskRunner):
    """Beam's DaskRunner.run_pipeline, with ``retries=`` passed to ``client.compute``."""

    def run_pipeline(self, pipeline, options):
        import dask.distributed as ddist

        retries = options.view_as(TaskRetryOptions).dask_task_retries
        if retries < 0:
            raise ValueError(f"--dask_task_retries must be >= 0, not {retries}")
        dask_options = options.view_as(dask_runner.DaskOptions).get_all_options(drop_default=True, current_only=True)
        bag_kwargs = dask_runner.DaskOptions._extract_bag_kwargs(dask_options)  # noqa: SLF001: as Beam's runner
        slurm = settings_from(options)
        if slurm is None:
            client = ddist.Client(**dask_options)
            return dask_runner.DaskRunnerResult(client, self._compute(client, pipeline, bag_kwargs, retries))
        cluster, keeping = start_cluster(slurm)
        try:
            dask_options.pop("address", None)
            client = ddist.Client(cluster, **dask_options)
            return _SlurmResult(client, self._compute(client, pipeline, bag_kwargs, retries), cluster, keeping)
        except BaseException:
            close_cluster(cluster, keeping)         # the worker jobs go with the failed start
            raise

    def _compute(self, client, pipeline, bag_kwargs, retries):
        import dask

        pipeline.replace_all(dask_runner.dask_overrides())
        visitor = self.to_dask_bag_visitor(bag_kwargs)
        pipeline.visit(visitor)
        # the last bag depends on the whole graph (the jobs end in one sink): computing it runs all
        graph = dask.optimize(list(visitor.bags.values())[-1])
        return client.compute(graph, retries=retries)


class _SlurmResult(dask_runner.DaskRunnerResult):
    """The pipeline's result; its worker jobs are cancelled once it has finished or failed."""

    def __init__(self, client, futures, cluster, keeping):
        super().__init__(client, futures)
        self._cluster, self._keeping = cluster, keeping

    def wait_until_finish(self, duration=None) -> str:
        try:
            return super().wait_until_finish(duration)
        finally:
            if self._state != PipelineState.RUNNING:
                self.client.close()
                close_cluster(self._cluster, self._keeping)
