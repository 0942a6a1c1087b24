"""The downstream filter job's functional core: scores, filters, config, fitted models, report.

Nothing here imports Beam; beam_pipelines/filter.py and transforms/filtering.py wrap it.
"""
