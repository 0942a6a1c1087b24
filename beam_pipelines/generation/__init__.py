"""The generation job's phases, one module each, in the order beam_pipelines/generate.py runs them:

    options.py    the command line
    check.py      everything refused before anything is written: options, models, languages,
                  device and precision, input shards, output location -> a ``Job`` and a ``Request``
    plan.py       input shards, records, bins, what ``--previous`` gives, the run to start or
                  continue -> ``Inputs`` and a ``Plan``
    dry_run.py    the plan printed with an estimate of its decoding time (``--dry_run``)
    decode.py     the Beam pipeline: read -> clean -> deduplicate -> decode each work unit -> write
    compact.py    the same pipeline's last stages: unit files rewritten into files sized for
                  readers, one summary of the run
    outcome.py    the run's manifest from that summary -> an ``Outcome`` for the commit and report

Two phases are shared with the filter job and live beside the jobs: beam_pipelines/commit.py
(claim, commit, publish) and beam_pipelines/report.py (what a job prints at its end).
"""
