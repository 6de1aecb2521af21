"""``fork.py series-comments [--write]`` (``make series-comments``): the comment line above each patch in both series
files, from its header."""
from ..authoring import series_comments
from .base import Command


class SeriesComments(Command):
    def add_arguments(self, parser):
        parser.add_argument("--write", action="store_true", help="rewrite them from the headers")

    def run(self, args):
        return series_comments(args.write)
