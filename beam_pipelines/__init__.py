"""Entry points of the Beam jobs: generate, filter, refresh, and Beam's options."""
from common.cli import quiet_beam_import

quiet_beam_import()          # before any module of this package imports apache_beam
