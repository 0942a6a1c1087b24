"""The check phase's device decisions: where the workers decode, in what precision, and how many
worker processes share each GPU."""
from __future__ import annotations

import logging

from beam_pipelines.options import is_local
from common.cli import UsageError

GPU_BATCH_PAIRS = 256        # --batch_pairs on a GPU unless given: larger decoder batches keep it busy

log = logging.getLogger("paragen")


def resolve_device(device: str | None, precision: str, runner: str) -> tuple[str | None, str]:
    """(device, precision) as the workers will use them. Checked here when the workers run on this
    machine (DirectRunner): --device cuda without a GPU, bf16 on a CPU that would emulate it.
    Elsewhere the workers resolve 'auto' themselves and the manifest's counters say what they used."""
    import torch

    from models.nmt.engines.fairseq_engine import cpu_has_native_bf16, gpu_capability, resolve_precision

    if not is_local(runner):
        return device, precision
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA GPU is visible on this machine (torch.cuda.is_available() is "
                         "False); leave --device unset to use the CPU")
    effective = device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = resolve_precision(precision, effective, gpu_capability(effective))
    except ValueError as exc:
        raise UsageError(f"--precision {precision}: {exc}") from None
    if resolved == "bf16" and effective == "cpu" and cpu_has_native_bf16() is False:
        raise UsageError("--precision bf16: this CPU has neither AVX512-BF16 nor AMX, so bf16 would be emulated "
                         "and several times slower than fp32; use --precision fp32 (the default on a CPU)")
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
