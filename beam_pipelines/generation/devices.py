"""The check phase's device decisions: where the workers decode, in what precision, and how many
worker processes share each GPU."""
from __future__ import annotations

import logging
from collections import Counter

from beam_pipelines.options import is_local
from common.cli import UsageError, option_value

GPU_BATCH_PAIRS = 256        # --batch_pairs on a GPU unless given: larger decoder batches keep it busy

log = logging.getLogger("paragen")


def resolve_device(device: str | None, precision: str, runner: str,
                   beam_args: tuple | list = ()) -> tuple[str | None, str]:
    """(device, precision) as the workers will use them, resolved where they run: on this machine
    for the DirectRunner, on each worker of a running Dask cluster (--dask_client_address) asked
    before anything is written, where workers that would decode in different precisions (a fleet
    mixing A100s and V100s under 'auto', GPUs and CPUs without --device) are refused: their rows
    would mix two precisions. Elsewhere (SLURM's workers, Flink, Dataflow: not started yet) the
    workers resolve 'auto' themselves and the unit records say what each used (the manifest's
    precision block, a warning when they differ)."""
    if is_local(runner):
        try:
            return setup_here(device, precision)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    address = option_value(list(beam_args), "--dask_client_address")
    if runner.endswith("DaskRunner") and address:
        return _resolve_on_dask_workers(address, device, precision)
    return device, precision


def setup_here(device: str | None, precision: str) -> tuple[str, str]:
    """(device, precision) this process would decode with; ValueError (its line) if it cannot:
    --device cuda without a GPU, a precision the device does not have, bf16 that a CPU would
    emulate. Run on the driver's machine or, through Dask, on each worker."""
    import torch

    from models.nmt.engines.fairseq_engine import cpu_has_native_bf16, gpu_capability, resolve_precision

    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA GPU is visible on this machine (torch.cuda.is_available() is "
                         "False); leave --device unset to use the CPU")
    effective = device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = resolve_precision(precision, effective, gpu_capability(effective))
    except ValueError as exc:
        raise ValueError(f"--precision {precision}: {exc}") from None
    if resolved == "bf16" and effective == "cpu" and cpu_has_native_bf16() is False:
        raise ValueError("--precision bf16: this CPU has neither AVX512-BF16 nor AMX, so bf16 would be emulated "
                         "and several times slower than fp32; use --precision fp32 (the default on a CPU)")
    return effective, resolved


def worker_setup(device: str | None, precision: str) -> dict:
    """What a Dask worker would decode with (run there by the driver): its device, precision and
    GPU's name, or the line saying why it cannot."""
    try:
        effective, resolved = setup_here(device, precision)
    except ValueError as exc:
        return {"refused": str(exc)}
    gpu = None
    if effective == "cuda":
        import torch

        gpu = torch.cuda.get_device_name(0)
    return {"device": effective, "precision": resolved, "gpu": gpu}


def _resolve_on_dask_workers(address: str, device: str | None, precision: str) -> tuple[str | None, str]:
    """(device, precision) every worker of the Dask cluster at ADDRESS resolves the same; a
    UsageError naming them when they do not agree or one cannot; (DEVICE, PRECISION) unchanged when
    the cluster has no worker yet or its scheduler does not answer (said: the records tell)."""
    from distributed import Client

    try:
        with Client(address, timeout=15) as client:
            setups = client.run(worker_setup, device, precision)
    except (OSError, TimeoutError) as exc:
        log.warning("the Dask scheduler at %s did not answer (%s): its workers resolve --precision %s themselves "
                    "and the manifest's precision block says what each used", address,
                    str(exc).splitlines()[0] if str(exc) else type(exc).__name__, precision)
        return device, precision
    if not setups:
        return device, precision
    refused = [s["refused"] for s in setups.values() if "refused" in s]
    if refused:
        raise UsageError(f"{len(refused)} of {len(setups)} Dask worker(s) at {address} cannot decode as asked: "
                         f"{'; '.join(sorted(set(refused)))}")
    kinds = Counter((s["device"], s["precision"], s["gpu"]) for s in setups.values())
    agreed = {(d, p) for d, p, _gpu in kinds}
    if len(agreed) > 1:
        said = "; ".join(f"{n} in {p} on {d}" + (f" ({gpu})" if gpu else "") for (d, p, gpu), n in sorted(kinds.items()))
        raise UsageError(f"--precision {precision}{'' if device else ' without --device'}: the {len(setups)} Dask "
                         f"workers at {address} would decode in different precisions ({said}), so the run's samples "
                         "and scores would mix them; set --device and --precision to one every worker has "
                         "(--precision fp32 runs everywhere)")
    (effective, resolved), = agreed
    return effective, resolved


def check_decode_step(mode: str, forward_meta: dict, device: str | None, runner: str) -> None:
    """Refuse a --decode_step that cannot apply: a step mode for a CTranslate2 model (it decodes
    its own way), CUDA graphs where the workers are this machine and it decodes on the CPU."""
    if mode == "auto":
        return
    if forward_meta["engine"] != "fairseq":
        raise UsageError(f"--decode_step {mode}: the forward model is a {forward_meta['engine']} model, which decodes "
                         "its own way; the step modes are the fairseq engine's (leave --decode_step unset)")
    if mode == "graphs" and is_local(runner):
        import torch

        if (device or ("cuda" if torch.cuda.is_available() else "cpu")) != "cuda":
            raise UsageError("--decode_step graphs replays CUDA graphs and this job decodes on the CPU; use "
                             "--decode_step compiled (or leave it unset: the eager loop is the CPU's fastest)")


def hashed_precision(requested: str, device: str | None, resolved: str) -> str:
    """The precision the config hash records: as requested, except that 'auto' on a GPU records
    what it resolved to where the driver can tell (the DirectRunner): 'auto' meant bf16 or fp16
    there before it meant fp32, and a refresh must not mix samples of two precisions. On the CPU
    'auto' is always fp32."""
    if requested != "auto" or device != "cuda":
        return requested
    return f"auto:cuda:{resolved}"


def gpu_worker_processes(beam_args: list[str], runner: str, processes_per_gpu: int) -> list[str]:
    """BEAM_ARGS for a DirectRunner run on this machine's GPUs: GPUs x PROCESSES_PER_GPU worker
    processes (each claims its GPU: models/nmt/devices.py), unless the user chose the running mode."""
    import torch

    chosen = any(a.startswith(("--direct_running_mode", "--direct_num_workers")) for a in beam_args)
    if chosen or not is_local(runner):
        return beam_args
    n = max(1, torch.cuda.device_count()) * processes_per_gpu
    log.info("%d GPU(s), %d decoding processes each: --direct_running_mode multi_processing --direct_num_workers %d",
             n // processes_per_gpu, processes_per_gpu, n)
    return [*beam_args, "--direct_running_mode", "multi_processing", "--direct_num_workers", str(n)]
