"""``python3 tools/fork.py <command>``: the one entry point of the fork's tools, over the one command table
(``forkq.commands``).

The table names each command's module, class and summary, so ``fork.py --help`` lists every command without
importing one, and a command imports only what it needs: ``materialize`` runs inside pip's isolated build
(``setup.py``), with the standard library alone. Every command is a ``forkq.commands.base.Command``; this module
runs one, and no command imports this module.
"""
import argparse
import signal
import sys
import textwrap
from typing import Optional, Sequence

from .commands import COMMANDS, create_command
from .commands.base import Command
from .common import ForkError, Terminated


def _overview(prog: str) -> argparse.ArgumentParser:
    width = max(len(name) for name in COMMANDS)
    listing = "\n".join(textwrap.fill(info.summary, 100, initial_indent=f"  {name:<{width}}  ",
                                       subsequent_indent=" " * (width + 4)) for name, info in COMMANDS.items())
    parser = argparse.ArgumentParser(
        prog=prog, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="The Lightning XLA fork's patch queue: materialize upstream Lightning 1.8.6 plus the series, "
                    "maintain the queue, and offer its fixes upstream.",
        epilog=f"commands:\n{listing}\n\n`{prog} COMMAND --help` shows the arguments of a command.")
    parser.add_argument("command", choices=list(COMMANDS), metavar="COMMAND", help="one of the commands below")
    return parser


def main(argv: Optional[Sequence[str]] = None, prog: str = "fork.py") -> int:
    """Run the command that ``argv``'s first argument names with the rest of it; ``prog`` names the script in help
    and error messages."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        _overview(prog).parse_args(argv[:1])  # prints the overview, or says what is wrong; exits
    command, argv = argv[0], argv[1:]
    cmd: Command = create_command(command)
    parser = argparse.ArgumentParser(prog=f"{prog} {command}", description=COMMANDS[command].summary)
    cmd.add_arguments(parser)
    args = parser.parse_args(argv)
    args.prog = prog
    try:
        return cmd.run(args)
    except ForkError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return cmd.error_code
    except (KeyboardInterrupt, Terminated) as err:
        signum = err.signum if isinstance(err, Terminated) else signal.SIGINT
        note = f"; {cmd.interrupted_note}" if cmd.interrupted_note else ""
        print(f"{prog}: interrupted ({signal.Signals(signum).name}){note}", file=sys.stderr)
        return 128 + int(signum)
