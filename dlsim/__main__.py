"""``python -m dlsim`` runs the command line."""

from dlsim.cli import entry

entry()
