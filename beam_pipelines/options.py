"""Beam's side of a job's command line: the runner, its options, worker threads, and running a
pipeline to its end. Shared by the generation and filter jobs.

A job parses its own options first and hands the rest to Beam. Beam only warns about options
it does not know and runs with its defaults, so a typo (``--presett``, ``--num-samples``) would
silently change a run; :func:`check_beam_args` refuses them instead, naming the closest option.
"""
from __future__ import annotations

import argparse
import difflib
import os

from common.cli import UsageError

# the DaskRunner is ours: Beam's with task retries (beam_pipelines/dask_runner.py)
_DASK = "beam_pipelines.dask_runner.DaskRunner"
RUNNER_ALIASES = {"daskrunner": _DASK, "dask": _DASK, "apache_beam.runners.dask.dask_runner.daskrunner": _DASK}


def qualify_runner(beam_args: list[str]) -> list[str]:
    """Beam knows the DaskRunner only by its module path; accept the short name too."""
    out = list(beam_args)
    for i, arg in enumerate(out):
        if arg == "--runner" and i + 1 < len(out):
            out[i + 1] = RUNNER_ALIASES.get(out[i + 1].lower(), out[i + 1])
        elif arg.startswith("--runner="):
            out[i] = "--runner=" + RUNNER_ALIASES.get(arg.split("=", 1)[1].lower(), arg.split("=", 1)[1])
    return out


def _wants_dask(beam_args: list[str] | None) -> bool:
    """Whether BEAM_ARGS (qualified) run on Dask or name a Dask option; None: any arguments."""
    if beam_args is None:
        return True
    named = [b for a, b in zip(beam_args, beam_args[1:]) if a == "--runner"]
    named += [a.split("=", 1)[1] for a in beam_args if a.startswith("--runner=")]
    return _DASK in named or any(a.startswith("--dask") for a in beam_args)


def _beam_parser(beam_args: list[str] | None = None):
    """An argument parser with every option of every registered PipelineOptions class; Dask's
    only where BEAM_ARGS (None: any) may need them."""
    from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

    import beam_pipelines.runners  # noqa: F401: the runners' retry and restart options, --slurm_*
    if _wants_dask(beam_args):
        # registers DaskOptions (--dask_client_address, ...) where Dask is installed; other runs
        # skip its import (Dask and distributed: 0.25 s of CPU in every job process)
        try:
            import beam_pipelines.dask_runner  # noqa: F401
        except ImportError:
            pass
    class OneLine(_BeamArgumentParser):
        def error(self, message):           # one line, not Beam's ~160 lines of usage before it
            raise UsageError(message)

    parser = OneLine(allow_abbrev=False)
    seen = {}
    for cls in PipelineOptions.__subclasses__():
        seen.setdefault(str(cls), cls)
    for cls in seen.values():
        cls._add_argparse_args(parser)  # noqa: SLF001: the same walk Beam's get_all_options makes
    return parser


def cluster_options_epilog() -> str:
    """The --help lines that name the project's cluster options (SLURM workers, Dask retries, Flink
    restarts), which Beam's pass-through would otherwise hide."""
    from beam_pipelines.runners import FlinkRestartOptions, TaskRetryOptions
    from beam_pipelines.slurm_settings import SlurmOptions

    names = []
    for cls in (SlurmOptions, TaskRetryOptions, FlinkRestartOptions):
        parser = argparse.ArgumentParser(add_help=False)
        cls._add_argparse_args(parser)  # noqa: SLF001: the options a class adds, as Beam collects them
        names += _option_names(parser)
    return ("Cluster options (docs/operations.md): " + ", ".join(names) + "; Dask: --dask_client_address, "
            "--dask_connection_timeout; Dataflow and Flink: Beam's own (--project, --region, --flink_master, ...).")


def _option_names(parser: argparse.ArgumentParser) -> list[str]:
    return [opt for action in parser._actions for opt in action.option_strings if opt.startswith("--")]


# options whose values are sbatch options (`--slurm_extra --qos=long`): argparse would read the
# value as an option of its own, and a value such as --output=... as the job's --output
DASHED_VALUES = ("--slurm_extra", "--slurm_skip")


def join_dashed_values(argv: list[str]) -> list[str]:
    """ARGV with `--slurm_extra VALUE` written `--slurm_extra=VALUE` (the value may begin with -)."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] in DASHED_VALUES and i + 1 < len(argv):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def check_beam_args(beam_args: list[str], job_parser: argparse.ArgumentParser) -> list[str]:
    """BEAM_ARGS with the runner name qualified, after refusing (UsageError) any argument that
    neither the job nor Beam knows and a runner Beam cannot create."""
    args = qualify_runner(beam_args)
    beam_parser = _beam_parser(args)
    _known, unknown = beam_parser.parse_known_args(args)
    if unknown:
        names = _option_names(job_parser) + _option_names(beam_parser)
        problems = []
        for i, arg in enumerate(unknown):
            if not arg.startswith("-"):
                if i and unknown[i - 1].startswith("--") and "=" not in unknown[i - 1]:
                    continue                    # the value of the unknown option before it
                problems.append(f"{arg!r} (a value without an option)")
                continue
            name = arg.split("=", 1)[0]
            close = difflib.get_close_matches(name.replace("-", "_").replace("__", "--", 1), names, n=1) or \
                difflib.get_close_matches(name, names, n=1)
            problems.append(f"{name}" + (f" (did you mean {close[0]}?)" if close else ""))
        raise UsageError(f"unknown option(s): {', '.join(problems)}; see --help")
    runner = runner_name(args)
    from apache_beam.runners.runner import create_runner

    try:
        create_runner(runner)
    except ImportError as exc:
        raise UsageError(f"--runner {runner} needs a Beam extra that is not installed ({exc})") from None
    except (ValueError, AttributeError) as exc:
        raise UsageError(f"--runner {runner}: {str(exc).splitlines()[0]}") from None
    return args


def runner_name(beam_args: list[str]) -> str:
    """The runner BEAM_ARGS ask for, as given or qualified (default DirectRunner)."""
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

    return PipelineOptions(beam_args).view_as(StandardOptions).runner or "DirectRunner"


def is_local(runner: str) -> bool:
    """True for the DirectRunner: its workers run on this machine, whose hardware can be checked here."""
    return runner.rsplit(".", 1)[-1].lower().removesuffix("runner") in ("direct", "bundlebaseddirect",
                                                                        "switchingdirect")


def worker_threads(requested: int, runner: str, running_mode: str | None, num_workers: int | None,
                   cpu_count: int) -> int | None:
    """Torch threads per worker process, or None to keep torch's default. Worker processes that
    share a machine must split its cores: oversubscribed, OpenMP threads wait on each other."""
    if requested < 0:
        raise UsageError(f"--torch_threads must be >= 0, not {requested}")
    if requested:
        return requested
    if is_local(runner) and running_mode in ("multi_processing", "multi_threading"):
        workers = num_workers or cpu_count          # Beam: 0 workers means one per core
        return max(1, cpu_count // workers)
    return None


def direct_workers(beam_args: list[str]) -> int | None:
    """Worker processes of a DirectRunner run (1 in memory), or None for other runners."""
    from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions

    runner = runner_name(beam_args)
    if not is_local(runner):
        return None
    direct = PipelineOptions(beam_args).view_as(DirectOptions)
    if direct.direct_running_mode in ("multi_processing", "multi_threading"):
        return direct.direct_num_workers or os.cpu_count() or 1
    return 1


def torch_threads_for(requested: int, beam_args: list[str]) -> int | None:
    """worker_threads() for the runner and DirectRunner options in BEAM_ARGS, on this machine."""
    from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions

    runner = runner_name(beam_args)
    direct = PipelineOptions(beam_args).view_as(DirectOptions)
    return worker_threads(requested, runner, direct.direct_running_mode, direct.direct_num_workers,
                          os.cpu_count() or 1)


def run_pipeline(build, beam_args: list[str], name: str = "paragen") -> None:
    """Build a pipeline with BUILD(pipeline) and run it to the end. Its Beam counters are for the
    runner's UI; what the jobs record comes from the records their workers write (the DaskRunner
    reports no metrics). On a Flink cluster the Flink job is called NAME (unless --job_name is given) and a stop of this
    process cancels it (beam_pipelines/flink.py)."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions, SetupOptions

    from beam_pipelines.flink import cancel_jobs_named, flink_rest, named, warn_if_no_restarts
    from common.stopping import at_end, not_at_end

    rest, cancel = flink_rest(beam_args), None
    if rest:
        beam_args, job_name = named(beam_args, name)

        def cancel():
            cancel_jobs_named(rest, job_name)
        at_end(cancel)
        warn_if_no_restarts(rest)
    try:
        options = PipelineOptions(beam_args)
        options.view_as(SetupOptions).save_main_session = False
        p = beam.Pipeline(options=options)
        build(p)
        result = p.run()
        result.wait_until_finish()
    finally:
        if cancel is not None:          # the Flink job has ended: a later stop has nothing to cancel
            not_at_end(cancel)
