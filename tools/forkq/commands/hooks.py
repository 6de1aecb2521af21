"""``fork.py hooks`` (``make hooks``): install the ``commit-msg`` hook that checks each commit message against the
rule of ``docs/maintaining.md`` (``forkq.commitmsg``)."""
from pathlib import Path

from .. import common
from .base import Command
from ..commitmsg import HOOK_MARK, hook_script
from ..common import ForkError, git


class Hooks(Command):
    def add_arguments(self, parser):
        parser.add_argument("--force", action="store_true", help="replace a commit-msg hook that is not this one")

    def run(self, args):
        hooks = Path(git(["rev-parse", "--git-path", "hooks"], cwd=common.ROOT).stdout.strip())
        hook = (hooks if hooks.is_absolute() else common.ROOT / hooks) / "commit-msg"
        if hook.exists() and HOOK_MARK not in hook.read_text(errors="replace") and not args.force:
            raise ForkError(f"{hook} exists and is not this tool's hook: look at it, then `python3 tools/fork.py "
                            "hooks --force` replaces it")
        hook.parent.mkdir(parents=True, exist_ok=True)
        hook.write_text(hook_script())
        hook.chmod(0o755)
        print(f"installed {hook}: each commit message is checked (subject <= 60 characters, a blank line, a body, "
              "no patch numbers)")
        return 0
