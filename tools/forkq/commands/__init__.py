"""The command table of ``tools/fork.py``: one module a command, each holding one ``Command`` class.

As pip's ``commands_dict``: the table names the module, the class and a summary, so that ``fork.py --help`` lists
the commands without importing any, and running one imports only its module. The order is the order of the help.
"""
import importlib
from collections import namedtuple
from typing import Any, Dict

CommandInfo = namedtuple("CommandInfo", "module_path, class_name, summary")

COMMANDS: Dict[str, CommandInfo] = {
    # the tree
    "materialize": CommandInfo("forkq.commands.materialize", "Materialize",
                               "write upstream 1.8.6 plus the series (or a prefix of it) to src/"),
    "version": CommandInfo("forkq.commands.version", "Version", "print the fork's version"),
    "list": CommandInfo("forkq.commands.list_", "List", "print the series with each patch's kind and subject"),
    # the queue
    "check": CommandInfo("forkq.commands.check", "Check",
                         "both queues: the header rules, the series files, the README, the patch references in the "
                         "docs and tests, and that each series applies"),
    "refresh": CommandInfo("forkq.commands.refresh", "Refresh", "rewrite a patch from the edits in src/"),
    "restat": CommandInfo("forkq.commands.restat", "Restat",
                          "redraw a patch's diffstat after sections under tests/ were added by hand"),
    "new": CommandInfo("forkq.commands.new", "New", "turn the edits in src/ into a new patch at the end of the series"),
    "series-comments": CommandInfo("forkq.commands.series_comments", "SeriesComments",
                                   "check (or write) the series files' comment lines from the patch headers"),
    "readme": CommandInfo("forkq.commands.readme", "Readme",
                          "write the generated blocks: the README's version example and count of the patches, "
                          "docs/patches.md's table"),
    # the fixes, proven and offered upstream
    "before-after": CommandInfo("forkq.commands.before_after", "BeforeAfter",
                                "each 1.8.6 fix's tests fail without its patch and pass with it"),
    "pr-series": CommandInfo("forkq.commands.pr_series", "PrSeries",
                             "the 1.8.6 fixes as a git am series for upstream's tag 1.8.6 (export, check-tag)"),
    "pr-series-266": CommandInfo("forkq.commands.pr_series_266", "PrSeries266",
                                 "the fixes for Lightning 2.6.6, patches/2.6.6 (tree, export, verify)"),
    "upstream-tests": CommandInfo("forkq.commands.upstream_tests", "UpstreamTests",
                                  "upstream's own 1.8.6 tests on the compat patches alone and on the series, compared"),
    # what is shipped and shown
    "unified": CommandInfo("forkq.commands.unified", "Unified",
                           "the lightning-lite and unified lightning wheels (wheels, tree, compare-upstream)"),
    "readme-bench": CommandInfo("forkq.commands.readme_bench", "ReadmeBench",
                                "copy the latest benchmark tables from results/ into bench/README.md and README.md"),
    "figures": CommandInfo("forkq.commands.figures", "Figures",
                           "every result under results/: which are not current (check), and measure them again (run)"),
    # this repository's own commits
    "commit-msg": CommandInfo("forkq.commands.commit_msg", "CommitMsg",
                              "check commit messages: a message file (the commit-msg hook) or the commits since "
                              "a base"),
    "hooks": CommandInfo("forkq.commands.hooks", "Hooks",
                         "install the commit-msg hook that checks each commit message"),
}


def create_command(name: str) -> Any:
    """An instance of the command ``name`` (its module imported now)."""
    module_path, class_name, _ = COMMANDS[name]
    return getattr(importlib.import_module(module_path), class_name)()
