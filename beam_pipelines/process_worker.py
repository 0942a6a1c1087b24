"""An SDK worker for Beam's PROCESS environment without Beam's Go boot program: what each Flink task
manager runs (through deploy/flink/sdk_worker.sh) to start the Python workers of a job when there is
no Docker (run_flink.sh ``ENV_TYPE=PROCESS BOOT=.../deploy/flink/sdk_worker.sh``).

A task manager starts the environment's command with ``--id``, ``--provision_endpoint``,
``--logging_endpoint``, ``--artifact_endpoint``, ``--control_endpoint`` and ``--semi_persist_dir``
(Beam's ProcessEnvironmentFactory). Beam's boot program (sdks/python/container/boot.go) asks the
provision service for the job's options and endpoints, installs the staged artifacts, and starts
``sdk_worker_main`` with them in its environment; this does the same but the install: the task
manager's Python already has the project and its pinned dependencies (the same venv the
bootstrap makes), as Beam's EXTERNAL worker pool assumes too. Unlike one EXTERNAL pool shared by
several task managers of a machine (whose workers' ids collide: each task manager numbers its own
from 1-1), every task manager gets workers of its own.
"""
from __future__ import annotations

import argparse
import os
import sys


def _descriptor(endpoint, fallback: str | None) -> str | None:
    """An ApiServiceDescriptor as the text format sdk_worker_main reads: the provision service's
    own, else one with the URL the command line gave."""
    from google.protobuf import text_format

    if endpoint is not None and endpoint.url:
        return text_format.MessageToString(endpoint)
    return f'url: "{fallback}"' if fallback else None


def worker_environment(argv: list[str]) -> dict[str, str]:
    """The environment sdk_worker_main needs, from the boot command line ARGV and the job's
    provision service."""
    import grpc
    from apache_beam.portability.api import beam_provision_api_pb2
    from apache_beam.portability.api.org.apache.beam.model.fn_execution.v1 import beam_provision_api_pb2_grpc
    from google.protobuf import json_format

    ap = argparse.ArgumentParser(prog="sdk_worker.sh", description=__doc__.split("\n\n")[0])
    ap.add_argument("--id", required=True)
    ap.add_argument("--provision_endpoint", required=True)
    ap.add_argument("--logging_endpoint")
    ap.add_argument("--artifact_endpoint")
    ap.add_argument("--control_endpoint")
    ap.add_argument("--semi_persist_dir", default="/tmp")
    a, _ = ap.parse_known_args(argv)
    with grpc.insecure_channel(a.provision_endpoint) as channel:
        info = beam_provision_api_pb2_grpc.ProvisionServiceStub(channel).GetProvisionInfo(
            beam_provision_api_pb2.GetProvisionInfoRequest(), metadata=[("worker_id", a.id)], timeout=120).info
    env = {"WORKER_ID": a.id, "SEMI_PERSISTENT_DIRECTORY": a.semi_persist_dir,
           "PIPELINE_OPTIONS": json_format.MessageToJson(info.pipeline_options),
           "RUNNER_CAPABILITIES": " ".join(info.runner_capabilities)}
    for name, field, fallback in (("CONTROL_API_SERVICE_DESCRIPTOR", "control_endpoint", a.control_endpoint),
                                  ("LOGGING_API_SERVICE_DESCRIPTOR", "logging_endpoint", a.logging_endpoint),
                                  ("STATUS_API_SERVICE_DESCRIPTOR", "status_endpoint", None)):
        text = _descriptor(getattr(info, field) if info.HasField(field) else None, fallback)
        if text:
            env[name] = text
    if "CONTROL_API_SERVICE_DESCRIPTOR" not in env:
        raise SystemExit("sdk_worker.sh: no control endpoint (neither --control_endpoint nor the provision service's)")
    return env


def main(argv=None) -> None:
    env = worker_environment(sys.argv[1:] if argv is None else argv)
    os.environ.update(env)
    from apache_beam.runners.worker import sdk_worker_main

    sdk_worker_main.main([])


if __name__ == "__main__":
    main()
