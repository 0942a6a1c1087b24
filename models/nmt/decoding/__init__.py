"""How the engines choose tokens, on the model's device: top-k sampling under per-request banned
phrases, as a loop over a tree of shared prefixes (sampler.py, prefix_decoder.py) or as a
fixed-shape step that torch.compile fuses and a GPU replays (fixed_sampler.py, fixed_step.py);
banned phrases as device tensors (bans.py); counter-based random numbers (device_random.py); beam
search by fairseq's generator (beam.py); an ensemble's members combined (ensemble.py); top-k and
oneDNN products for the CPU (topk.py, onednn.py); and counting host<->device round trips
(round_trips.py). Imports only models/nmt/engine.py and devices.py above it."""
