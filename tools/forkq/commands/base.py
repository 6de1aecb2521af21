"""``Command``: what every command of the table is (``forkq.cli`` runs one; each ``commands/<command>.py`` holds one
subclass). Standard library only: ``materialize`` runs inside pip's isolated build."""
import argparse


class Command:
    """One command: ``add_arguments`` declares its arguments (subcommands included), ``run`` does the work and returns
    the exit code (``args.prog`` is the script's name). A ForkError is printed as ``<prog>: error: <message>``,
    without a traceback, and exits with ``error_code``."""

    error_code = 1
    #: said after an interrupt (Ctrl-C, SIGTERM), when the command guarantees it
    interrupted_note = ""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        pass

    def run(self, args: argparse.Namespace) -> int:
        raise NotImplementedError
