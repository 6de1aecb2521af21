"""``docs/upstream-prs.md``: the 1.8.6 series as exported (one section a fix: its description, changes, tests and
CHANGELOG entry, what became of it on Lightning 2.6.6), the last ``check-tag`` result, and the 2.6.6 series'
section (``pr266``)."""
import json
from pathlib import Path
from typing import Dict, List, Sequence

from ...patchfile import touched_files
from .check_tag import CHECK_RESULT
from .testmodules import test_names, updated_tests


#: what became of each fix on upstream's current line, Lightning 2.6.6 (read in its source, measured by the 2.6.6
#: series' tests where one is named); shown in docs/upstream-prs.md
ON_CURRENT_LINE = {
    "0005-tpu-reduce-gradients-inside-the-closure.patch":
        "The Trainer reduces after its closure since 1.9.0 (#16020). Still broken in 2.6.6 and offered: Fabric's "
        "`optimizer.step(closure)` (2.6.6 series, 1) and the all-reduce lost after an in-place edit of the gradients, "
        "e.g. clipping in manual optimization (2.6.6 series, 2). Not offered: averaging before `on_after_backward` and "
        "user clipping, which changes what those hooks see and is for upstream to decide.",
    "0006-xla-mark-step-after-optimizer-step.patch":
        "Upstream has it: the Trainer since 1.9.0 (#16020); Fabric's `XLAPrecision.optimizer_step` passes "
        "`barrier=True`.",
    "0007-running-loss-on-cpu-for-xla.patch": "Not applicable: 2.x has no running loss buffer (`TensorRunningAccum`).",
    "0008-result-collection-stays-on-cpu-for-xla.patch":
        "Not applicable: 2.x keeps logged values on their device and no longer moves them to the CPU and back.",
    "0009-xla-evaluation-steps-end-with-a-barrier.patch":
        "Still missing in 2.6.6 (4470 IR nodes pending after 60 validation batches); offered as 2.6.6 series, 5.",
    "0010-defer-host-transfer-of-logged-xla-values.patch":
        "2.x logs without a host copy, but reads every progress bar value from the device two to three times a step "
        "and converts logged values one tensor at a time; offered as 2.6.6 series, 3 and 4.",
    "0011-xla-running-loss-joins-the-logged-values-transfer.patch":
        "Not applicable: 2.x has no running loss; its progress bar reads are 2.6.6 series, 3.",
    "0012-xla-logged-torchmetrics-stay-on-the-device.patch":
        "2.x keeps a logged metric on its device; its step value read twice a step on the progress bar (4 transfers "
        "with the loss) is 2.6.6 series, 3 and 4.",
    "0013-xla-bf16-converts-the-module.patch":
        "Not checked on 2.6.6, which still sets the deprecated `XLA_USE_BF16` (read once, when the runtime starts); "
        "the pattern benchmark saw bf16 in its graph.",
    "0014-xla-one-graph-per-batch-with-accumulation-and-manual-optimization.patch":
        "Still in 2.6.6 and not offered yet: after the 2.6.6 series, accumulation leaves 136 IR nodes pending per "
        "accumulating batch, and manual optimization with two optimizers runs 3 graphs a step (a barrier per "
        "`optimizer.step`), a design change in `XLAPrecision`.",
    "0015-xla-profiler-leaves-the-step-barrier-to-its-step-trace.patch":
        "Carried into 2.6.6 series, 5, which leaves the evaluation barrier to the profiler's step trace.",
    "0016-xla-interrupted-runs-leave-nothing-queued.patch":
        "Not applicable: it frees the fork's queue of deferred host copies, which 2.x does not have.",
    "0017-xla-checkpoint-keeps-callback-state.patch":
        "Not needed: 2.6.6's XLA strategies keep the `callbacks` key.",
    "0018-atomic-checkpoint-writes.patch":
        "Not checked under a kill; 2.6.6 writes checkpoints through an fsspec transaction (`_atomic_save`).",
    "0077-optimizer-step-counters-stay-on-the-host.patch":
        "Upstream has it since 2.4.0 (#20019): `_optimizer_to_device` leaves every `step` where it is (the fork moves "
        "it for `capturable` and `fused` groups, as torch's `load_state_dict` does).",
}


def _tag_check_lines(records: Sequence[Dict], result_file: Path = CHECK_RESULT) -> List[str]:
    """What ``check-tag`` last found, if it checked the series as it is now."""
    if not result_file.exists():
        return ["_Not checked on upstream's tag yet: run `python3 tools/fork.py pr-series check-tag`._"]
    result = json.loads(result_file.read_text())
    names = [rec["mbox"].name for rec in records]
    if result.get("patches") != names:
        return ["_The last `check-tag` run checked another series; run it again._"]
    collect, ran = result.get("collect", {}), result.get("run", {})
    counted = ", ".join(f"{n} {w}" for w, n in ran.items()) if ran else "not run"
    return [
        f"Checked with `fork.py pr-series check-tag` on upstream's tag `1.8.6` (its `src/`, `tests/`, `setup.cfg`): "
        f"`git am` takes all {len(names)} patches; the {len(result.get('test_modules', []))} test modules they add "
        + (f"and the {len(result['updated_upstream_tests'])} upstream tests they update "
           if result.get("updated_upstream_tests") else "")
        + f"collect under upstream's pytest configuration ({'no error' if result.get('collect_ok') else 'ERRORS'}, "
        f"{sum(n for w, n in collect.items() if 'collected' in w)} tests) and, run there with the fork's compatibility "
        f"patches applied on top so that the tag imports on torch {result.get('versions', {}).get('torch', '?')}, "
        f"give: {counted}"
        + (f" (not run: {', '.join(f'`{n}`' for n in result['not_run_needs_real_tpu'])}, which need a real TPU)."
           if result.get("not_run_needs_real_tpu") else "."),
    ]


def render_doc(records: Sequence[Dict]) -> str:
    out = [
        "# Upstream contributions",
        "",
        "<!-- generated by `make pr-series` (`tools/fork.py pr-series`) from patches/1.8.6/, patches/2.6.6/ and the tests that declare"
        " FIXED_BY; do not edit by hand -->",
        "",
        "Two series, one per upstream line, and the reports for PyTorch/XLA.",
        "",
        "- [Lightning 1.8.6](#lightning-186-the-forks-base): the fork's fixes as a `git am` series for tag `1.8.6`, "
        "for anyone maintaining 1.8.6. Upstream released nothing after 1.8.6 on the 1.8 line and takes changes on its "
        "current line only, so these are not offered as pull requests.",
        "- [Lightning 2.6.6](#lightning-266-the-current-line): one pull request per defect that the latest release "
        "still has, against upstream's current source layout.",
        "- PyTorch/XLA: two torch_xla problems found on the way, written up to be filed: "
        "[docs/upstream-bugs.md](upstream-bugs.md) (the all-reduce of `.grad.data` lost after an in-place edit of the "
        "gradients, and `xm.optimizer_step` with a closure reducing before backward).",
        "",
        "## Lightning 1.8.6 (the fork's base)",
        "",
        "The `Kind: fix` patches of `patches/1.8.6/series`, in order. `make pr-series` writes them as mbox patches to "
        "`build/pr-series/` and checks that `git am` takes them in order on the pinned 1.8.6 wheel's tree and that "
        "the result equals upstream plus the fix patches. The compatibility patches (PJRT, NumPy 2 and setuptools, "
        "torch >= 2.1) stay in the fork. Each patch's `Origin` says where it comes from (a backport names the upstream "
        "pull request) and `Forwarded` what became of it upstream.",
        "",
        *_tag_check_lines(records),
        "",
        "Apply: `git checkout -b <branch> 1.8.6 && git am build/pr-series/*.patch`.",
        "",
    ]
    if not records:
        out += ["_The series holds no fix patch yet._", ""]
    for i, rec in enumerate(records, 1):
        fix = rec["fix"]
        bug = fix.trailers.get("Bug", "none")
        src_files = [f for f in touched_files(rec["mbox"].read_text(), tree="src") if f.startswith("src/")]
        out += [
            f"### 1.8.6-{i}. {fix.subject}",
            "",
            f"- Patch: `build/pr-series/{rec['mbox'].name}` (fork patch `patches/1.8.6/{fix.name}`)",
            f"- Bug: {bug if bug != 'none' else 'no upstream issue filed'}",
            f"- Origin: {fix.trailers.get('Origin', '?')}",
            f"- Forwarded: {fix.trailers.get('Forwarded', '?')}",
            f"- On Lightning 2.6.6: {ON_CURRENT_LINE.get(fix.name, 'not examined')}",
            f"- Applies to `1.8.6` on its own: {'yes' if rec['alone'] else 'no, apply the patches before it first'}",
            "",
            "#### Description",
            "",
            fix.body.strip(),
            "",
            "#### Changes",
            "",
            *[f"- `{f}`" for f in src_files],
            "",
            "#### Tests",
            "",
        ]
        updated = updated_tests(fix.tests_diff)
        if rec["tests"] or updated:
            for path, content in rec["tests"]:
                out.append(f"- `{path}`: " + ", ".join(f"`{t}`" for t in test_names(content)))
            for path, names in updated.items():
                out.append(f"- `{path}` (upstream's, updated for the change of behaviour): "
                           + (", ".join(f"`{t}`" for t in names) or "see the diff"))
            out += ["", "In the fork, `make before-after` runs these tests without the patch (where they must fail, "
                    "except regression guards) and with it (where they must pass)."]
        else:
            out.append("- none yet")
        out.append("")
        changelog = fix.changelog
        out += ["#### CHANGELOG", ""] + ([f"    {line}" for line in changelog] or ["- no entry in the patch"]) + [""]
        if rec["warnings"]:
            out += ["#### Still to do", ""] + [f"- {w}" for w in rec["warnings"]] + [""]
    out += _current_line_section()
    return "\n".join(out).rstrip("\n") + "\n"


def _current_line_section() -> List[str]:
    """The section of the 2.6.6 series (``forkq.series.pr266``)."""
    from .. import pr266

    return ["", pr266.render_doc_section().rstrip("\n"), ""]


