"""Beam DoFns and PTransforms: thin adapters around the project's core."""
from common.cli import quiet_beam_import

quiet_beam_import()          # before any module of this package imports apache_beam
