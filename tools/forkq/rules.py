"""The header rules of a patch (docs/maintaining.md, "What a patch looks like"): its fields, its body, its CHANGELOG
lines, a 2.6.6 patch as one pull request, the order of the kinds in the 1.8.6 series, and a whole queue checked
(its series file's comment lines included). Standard library and git only."""
import re
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from . import common
from .common import KINDS, UPSTREAM_TESTS, ForkError
from .patchfile import URL, Patch, added_tests, changelog_entries, numstat
from .seriescomments import read_series_text, series_text
from .seriesfile import read_series

#: the fields a patch may carry, in the order they are written (DEP-3, plus the fork's own ``Kind``)
FIELDS = ("Bug", "Forwarded", "Applied-Upstream", "Origin", "Kind")
FORWARDED = ("no", "not-needed")
ORIGIN_CATEGORIES = ("upstream", "backport", "other")
CHANGELOG_VERBS = ("Added", "Changed", "Deprecated", "Removed", "Fixed")
CHANGELOG_MAX = 160
BODY_WIDTH = 72


class Base:
    """What differs between the two queues: where they live, which fields a patch must carry, how long its body
    may be, and the rules of a pull request against Lightning 2.6.6."""

    def __init__(self, name: str, required: Sequence[str], body_lines: int, pull_requests: bool) -> None:
        self.name, self.required, self.body_lines, self.pull_requests = name, tuple(required), body_lines, pull_requests

    @property
    def patch_dir(self) -> Path:
        return common.PATCH_DIR if self.name == "1.8.6" else common.PATCH_DIR_266


BASES = {
    "1.8.6": Base("1.8.6", ("Forwarded", "Origin", "Kind"), 15, pull_requests=False),
    # a pull request's description may keep the small table of what it measured
    "2.6.6": Base("2.6.6", ("Forwarded", "Origin"), 25, pull_requests=True),
}
PR_TEST_ROOTS = ("tests/tests_fabric/", "tests/tests_pytorch/")

# positional references: a patch names the behaviour it builds on, never its place in a series
POSITIONAL = re.compile(
    r"\b(?:the )?(?:previous|next|preceding|following) patch(?:es)?\b"
    r"|\bthe patch(?:es)? (?:before|after)\b"
    r"|\bpatch(?:es)? \d{4}\b"
    r"|\bissue \d+ of the fork\b|\bthe fork's issue \d+\b",
    re.I,
)


def value_problem(key: str, value: str) -> Optional[str]:
    """What is wrong with the value of one field, saying what is allowed; None when it is well-formed."""
    if key == "Bug" and not re.fullmatch(URL, value):
        return (f"Bug: {value!r} is not one https:// URL. Bug holds exactly one URL with nothing after it; without an "
                "upstream issue, drop the Bug line (explanations go into the body)")
    if key == "Forwarded" and value not in FORWARDED and not re.fullmatch(URL, value):
        return (f"Forwarded: {value!r} is not allowed. Write exactly `no`, `not-needed`, or one https:// URL (of the "
                "upstream pull request), with nothing after it; reasons go into the body")
    if key == "Origin" and value != "vendor" and not re.fullmatch(rf"(?:{'|'.join(ORIGIN_CATEGORIES)}), {URL}", value):
        return (f"Origin: {value!r} is not allowed. Write exactly `vendor` for a patch written by the fork (the From: "
                f"line stands for it), or `<category>, <URL>` with category {', '.join(ORIGIN_CATEGORIES)} and the "
                "URL of the upstream commit or pull request, nothing after it")
    if key == "Applied-Upstream" and not re.fullmatch(rf"\d+(?:\.\d+)+, {URL}", value):
        return (f"Applied-Upstream: {value!r} is not `<version>, <URL>` (e.g. `1.9.0, "
                "https://github.com/Lightning-AI/lightning/pull/16020`), nothing after the URL")
    if key == "Kind" and value not in KINDS:
        return f"Kind must be one of {KINDS}, not {value!r}"
    return None


def field_problems(fields: Sequence[Tuple[str, str]], required: Sequence[str] = ("Forwarded", "Origin", "Kind")
                   ) -> List[str]:
    """What breaks the header rules in ``fields`` (``[(key, value)]`` in file order); each message says what is
    allowed."""
    problems: List[str] = []
    keys = [k for k, _ in fields]
    for key in sorted({k for k in keys if keys.count(k) > 1}, key=keys.index):
        problems.append(f"field {key!r} appears {keys.count(key)} times; write it once")
    for key in keys:
        if key not in FIELDS:
            problems.append(f"field {key!r} is not one of the fork's fields ({', '.join(FIELDS)}); "
                            "move what it says into the body")
    for key in required:
        if key not in keys:
            problems.append(f"field {key!r} missing")
    value = dict(fields)
    problems += [p for p in (value_problem(k, v) for k, v in value.items() if k in FIELDS) if p]
    # the rules between fields: a backport says where upstream applied it, and needs no forwarding
    forwarded, applied, origin = value.get("Forwarded"), value.get("Applied-Upstream"), value.get("Origin", "")
    # (judged only on a well-formed Origin: a malformed one is reported above, once)
    if origin.startswith("backport, ") and value_problem("Origin", origin) is None:
        if applied is None:
            problems.append("a backport (Origin: backport, ...) needs `Applied-Upstream: <version>, <URL>`")
        if forwarded is not None and forwarded != "not-needed":
            problems.append(f"a backport has `Forwarded: not-needed`, not {forwarded!r}")
    elif applied is not None and origin and value_problem("Origin", origin) is None:
        problems.append("Applied-Upstream is only for a backport: with it, write `Origin: backport, <URL>`")
    return problems


def body_problems(subject: str, body: str, max_lines: int = 15) -> List[str]:
    """The body says why in a few short lines and names behaviours, never places in a series."""
    problems = []
    lines = body.splitlines()
    if len(body.strip()) < 40:
        problems.append("the body must say what was wrong and why this fix")
    if len(lines) > max_lines:
        problems.append(f"the body has {len(lines)} lines; at most {max_lines} (why, in a few lines, and the measured "
                        "effect in one)")
    for number, line in enumerate(lines, 1):
        # a URL cannot be wrapped: a line holding only one may be longer
        if len(line) > BODY_WIDTH and not re.fullmatch(rf"\s*(?:[-*] )?<?{URL}>?[.,;)]*", line):
            problems.append(f"body line {number} has {len(line)} characters; at most {BODY_WIDTH}")
    for text in (subject, body):
        for m in POSITIONAL.finditer(text):
            problems.append(f"{m.group(0)!r} points at a place in the series; name the behaviour instead")
    return problems


def changelog_problems(diff: str, bug: Optional[str]) -> List[str]:
    """Each CHANGELOG entry is one line in upstream's form, under its heading, linked to the Lightning issue."""
    problems = []
    link = None
    m = re.fullmatch(r"https://github\.com/Lightning-AI/lightning/(?:issues|pull)/(\d+)", bug or "")
    if m:
        link = f" ([#{m.group(1)}]({bug}))"
    for heading, line in changelog_entries(diff):
        if line.startswith("#"):
            continue  # a heading, or the release line above it
        verb = re.match(rf"- ({'|'.join(CHANGELOG_VERBS)}) ", line)
        if not verb:
            problems.append(f"CHANGELOG line {line[:60]!r}...: an entry is one line that starts with "
                            f"`- Fixed `, `- Added `, `- Changed ` (or `- Deprecated `, `- Removed `)")
            continue
        if heading is not None and heading != verb.group(1):
            problems.append(f"CHANGELOG entry `- {verb.group(1)} ...` stands under `### {heading}`; "
                            f"put it under `### {verb.group(1)}`")
        if len(line) > CHANGELOG_MAX:
            problems.append(f"CHANGELOG entry `{line[:50]}...` has {len(line)} characters; at most {CHANGELOG_MAX}")
        if link and not line.endswith(link):
            problems.append(f"CHANGELOG entry `{line[:50]}...` must end with `{link.strip()}` (the Bug URL)")
    return problems


def pull_request_problems(patch: Patch) -> List[str]:
    """What keeps a 2.6.6 patch from being one pull request against upstream's source layout."""
    problems = []
    if not patch.text.startswith("From 0000000000000000000000000000000000000000 "):
        problems.append("not a `git format-patch --zero-commit` mbox (first line)")
    author = patch.headers.get("From")
    if author and author != common.AUTHOR:
        problems.append(f"author {author!r}, the series uses {common.AUTHOR!r}")
    if len(patch.body.strip()) < 200:
        problems.append("the message must be the PR description (what was wrong, the fix, the tests)")
    files = patch.files
    outside = [f for f in files if not f.startswith(("src/lightning/",) + PR_TEST_ROOTS)]
    if outside:
        problems.append(f"touches paths outside upstream's src/lightning/ and tests/: {outside}")
    if not added_tests(patch.text, PR_TEST_ROOTS):
        problems.append(f"adds no test under {' or '.join(PR_TEST_ROOTS)}")
    if files and not any(f.endswith("CHANGELOG.md") for f in files):
        problems.append("no CHANGELOG entry")
    return problems


def validate(path: Path, base: str = "1.8.6") -> List[str]:
    """Problems with one patch of the ``base`` queue (``1.8.6`` or ``2.6.6``), each prefixed with the file name;
    empty when the patch follows every rule."""
    rules = BASES[base]
    try:
        patch = Patch.read(path)
    except ForkError as err:
        return [f"{path.name}: {err}"]
    text, headers = patch.text, patch.headers
    problems = []
    if "From_" in headers and not re.fullmatch(r"From [0-9a-f]{40} Mon Sep 17 00:00:00 2001", headers["From_"]):
        problems.append("the first line must be git format-patch's `From <sha> Mon Sep 17 00:00:00 2001`")
    for key in ("From_", "From", "Date", "Subject"):
        if key not in headers:
            problems.append(f"header {key.rstrip('_')!r} missing")
    if "Subject" in headers and not headers["Subject"].startswith("[PATCH"):
        problems.append("the Subject must start with `[PATCH]` (git format-patch writes it)")
    if not patch.subject:
        problems.append("empty subject")
    if not re.search(r"^---$", text.split("\ndiff --git ", 1)[0], flags=re.M):
        problems.append("no `---` line (then the diffstat) between the message and the diff")
    if not patch.fields_separated:
        problems.append("a blank line must separate the body from the fields")
    problems += field_problems(patch.fields, rules.required)
    problems += body_problems(patch.subject, patch.body, rules.body_lines)
    if not patch.diff:
        problems.append("no diff")
    else:
        problems += changelog_problems(patch.diff, patch.trailers.get("Bug"))
    if rules.pull_requests:
        problems += pull_request_problems(patch)
    else:
        tests_diff = patch.tests_diff if patch.diff else ""
        if tests_diff:
            try:
                numstat(tests_diff)
            except ForkError as err:
                problems.append(f"its sections under {UPSTREAM_TESTS} (updates of upstream's tests) are not a "
                                f"valid diff: {err}")
    return [f"{path.name}: {p}" for p in problems]


def kind_order_problems(kinds: Sequence[Optional[str]]) -> List[str]:
    """The series holds the compat patches that port upstream first, then the fixes, then the compat patches that
    must follow them (they port lines the fixes add, e.g. to today's torch_xla API), then the features.

    The fixes stay one contiguous run, so that they apply to upstream on their own (``make pr-series``).
    """
    shape = "".join({"compat": "c", "fix": "x", "feature": "f"}[k] for k in kinds if k in KINDS)
    if re.fullmatch(r"c*x*c*f*", shape):
        return []
    return ["the series must hold the compat patches first, then the fix patches, then the compat patches that port"
            " the fixes' own lines, then the feature patches"]


def queue_problems(base: str = "1.8.6", patch_dir: Optional[Path] = None) -> List[str]:
    """Every patch of a queue follows the header rules, every ``*.patch`` is listed, the kinds are in their order,
    and the series file's comment lines are the ones ``series-comments --write`` writes."""
    patch_dir = BASES[base].patch_dir if patch_dir is None else patch_dir
    series = read_series(patch_dir / "series")
    problems = [p for name in series for p in validate(patch_dir / name, base)]
    listed = set(series)
    for stray in sorted(patch_dir.glob("*.patch")):
        if stray.name not in listed:
            problems.append(f"{stray.name}: in {patch_dir.name}/ but not in its series")
    kinds = [Patch.read(patch_dir / n).kind for n in series]
    problems += kind_order_problems(kinds)
    if read_series_text(patch_dir) != series_text(patch_dir):
        problems.append(f"{patch_dir.name}/series: its comment lines are not those of the patch headers; "
                        "`python3 tools/fork.py series-comments --write` writes them")
    return problems
