"""``fork.py figures``: every result under ``results/`` has one command that measures it again, and the check names
exactly the results a change of the series makes stale (a compat patch: every result; a fix patch: the results of the
whole series and the PR series check; a feature patch: the results of the whole series only)."""
import json
import shutil
from pathlib import Path

from forkq import bench_readme, common, figures
from forkq import stamp as fork_stamp


def _results_of(patch_dir: Path, folder: Path) -> Path:
    """A results folder whose every result measured the series in ``patch_dir`` (the compat baseline: its compat
    tree)."""
    folder.mkdir()
    stamp = fork_stamp.make(patch_dir)
    for figure in figures.FIGURES:
        data = {"stamp": stamp}
        if figure.depends_on == "compat":
            data["version"] = figures.compat_version(patch_dir)
        if figure.depends_on == "fixes":
            data["stamp"] = {**stamp, "inputs": figures.fixes_version(patch_dir)}
        (folder / figure.files[0]).write_text(json.dumps(data))
    return folder


def _copy_of_patches(tmp_path: Path) -> Path:
    patch_dir = tmp_path / "patches"
    shutil.copytree(common.PATCH_DIR, patch_dir)
    return patch_dir


def _change(patch_dir: Path, kind: str) -> str:
    """Add a line to the body of the last patch of ``kind``; its name."""
    from forkq.patchfile import Patch
    from forkq.seriesfile import read_series

    name = [n for n in read_series(patch_dir / "series") if Patch.read(patch_dir / n).kind == kind][-1]
    text = (patch_dir / name).read_text()
    (patch_dir / name).write_text(text.replace("\nForwarded:", "\nOne more line of why.\n\nForwarded:", 1))
    return name


def test_every_result_under_results_has_one_command():
    # the JSON of each result, and its other files, belong to one figure each; figures.json is the run's own log
    owned = [name for figure in figures.FIGURES for name in figure.files]
    assert len(owned) == len(set(owned))
    on_disk = {p.name for p in (common.ROOT / "results").iterdir()} - {figures.TIMES.name}
    assert on_disk <= set(owned), f"results without a command: {sorted(on_disk - set(owned))}"
    assert all(f.command.startswith("make ") for f in figures.FIGURES)


def test_nothing_is_stale_when_every_result_measured_this_series(tmp_path):
    patch_dir = _copy_of_patches(tmp_path)
    results = _results_of(patch_dir, tmp_path / "results")
    assert figures.stale(results, patch_dir=patch_dir) == []
    assert figures.report(results, patch_dir=patch_dir) == []


def test_a_changed_feature_patch_makes_the_series_results_stale_and_not_the_compat_baseline(tmp_path):
    patch_dir = _copy_of_patches(tmp_path)
    results = _results_of(patch_dir, tmp_path / "results")
    _change(patch_dir, "feature")
    named = {figure.name for figure, _ in figures.stale(results, patch_dir=patch_dir)}
    assert named == {f.name for f in figures.FIGURES if f.depends_on == "series"}
    lines = figures.report(results, patch_dir=patch_dir)
    assert len(lines) == len(named)
    assert any("results/checkpoint.json: it measured the fork" in line and "`make bench-checkpoint`" in line
               for line in lines)


def test_a_changed_fix_patch_makes_the_pr_series_check_stale_too(tmp_path):
    patch_dir = _copy_of_patches(tmp_path)
    results = _results_of(patch_dir, tmp_path / "results")
    _change(patch_dir, "fix")
    whys = {figure.name: why for figure, why in figures.stale(results, patch_dir=patch_dir)}
    assert set(whys) == {f.name for f in figures.FIGURES if f.depends_on in ("series", "fixes")}
    assert whys["pr-series"].startswith("it checked the fix and compat patches of 1.8.6+xla.")
    assert whys["pr-series"].endswith(f"the series now gives {figures.fixes_version(patch_dir)}")


def test_a_changed_compat_patch_makes_the_compat_baseline_stale_too(tmp_path):
    patch_dir = _copy_of_patches(tmp_path)
    results = _results_of(patch_dir, tmp_path / "results")
    _change(patch_dir, "compat")
    named = {figure.name for figure, _ in figures.stale(results, patch_dir=patch_dir)}
    assert named == {f.name for f in figures.FIGURES}
    (why,) = [w for f, w in figures.stale(results, patch_dir=patch_dir) if f.depends_on == "compat"]
    assert "it measured the compat tree" in why and "the series' compat patches now give" in why


def test_the_compat_baseline_is_current_without_the_compat_patches_its_run_left_out(tmp_path):
    """The run of upstream's tests leaves out of the compat tree a compat patch whose every line the fixes add, and
    records it: the baseline measured that tree, and stays current; a compat patch it did not leave out, changed,
    makes it stale."""
    from forkq.patchfile import Patch
    from forkq.seriesfile import read_series

    patch_dir = _copy_of_patches(tmp_path)
    results = _results_of(patch_dir, tmp_path / "results")
    compats = [n for n in read_series(patch_dir / "series") if Patch.read(patch_dir / n).kind == "compat"]
    baseline = results / "upstream-tests-xla-1.8.6-compat.json"
    data = json.loads(baseline.read_text())
    data.update(version=figures.compat_version(patch_dir, [compats[-1]]), left_out={compats[-1]: "the fixes add it"})
    baseline.write_text(json.dumps(data))
    assert figures.stale(results, patch_dir=patch_dir) == []
    _change(patch_dir, "compat")  # the last compat patch: the one left out
    assert [f.name for f, _ in figures.stale(results, patch_dir=patch_dir) if f.depends_on == "compat"] == []
    first = patch_dir / compats[0]
    first.write_text(first.read_text().replace("\nForwarded:", "\nOne more line of why.\n\nForwarded:", 1))
    assert [f.name for f, _ in figures.stale(results, patch_dir=patch_dir) if f.depends_on == "compat"] == [
        "upstream-tests-xla-compat"]


def test_a_missing_or_unstamped_result_is_stale(tmp_path):
    patch_dir = _copy_of_patches(tmp_path)
    results = _results_of(patch_dir, tmp_path / "results")
    (results / "llm.json").unlink()
    (results / "host.json").write_text(json.dumps({"summary": {}}))
    whys = {f.name: w for f, w in figures.stale(results, patch_dir=patch_dir)}
    assert whys == {"llm": "results/llm.json is missing", "host": "results/host.json carries no stamp"}


def _checkpoint(stamp):
    return {"stamp": stamp, "config": {"every": 5},
            "summary": {"state_mb": 480.2, "background": {"added_s": 0.34, "wait_s": 0.65, "quiet_copy_s": 0.26},
                        "background_added_over_quiet_copy": 1.31, "sync_stall_over_background_stall": 3.2,
                        "background_fit_cost_per_save_s": 1.85, "sync_fit_cost_per_save_s": 2.54}}


def _llm(stamp):
    row = {"step_s": 0.6, "losses": [3.0, 2.0]}
    summary = {key: {"fork": dict(row), "recipe": {**row, "step_s": 0.6 / 0.98}} for key in bench_readme.LLM_CONFIGS}
    return {"stamp": stamp, "config": {"devices": 4, "rounds": 3}, "summary": summary}


def test_the_headline_quotes_the_checkpoint_and_the_llm_results_with_their_stamps():
    digest = "ab" * 32
    stamp = {"fork": "1.8.6+xla.88.gabababab", "digest": digest, "date": "2026-12-06 06:00 UTC"}
    block = bench_readme.figures_block(None, None, digest, _checkpoint(stamp), _llm(stamp))
    text = " ".join(block.split())
    assert "in the background adds 0.34 s to the training thread, 1.31 x a quiet copy to the host" in text
    assert "after waiting 0.65 s for the step" in text and "stalls 3.2 x longer" in text
    assert "a save costs 1.85 s against 2.54 s synchronously" in text
    assert "32 0.98, 32 + ckpt 0.98, bf16-mixed 0.98, bf16-mixed + ckpt 0.98; the same losses at every step" in text
    assert text.count(f"(series digest {digest[:12]})") == 2
    # a page showing them passes the check of this series, and fails that of another
    page = f"{bench_readme.FIGURES_BEGIN}\n{block}\n{bench_readme.FIGURES_END}\n"
    assert bench_readme.stale_blocks("", page, digest) == []
    (problem,) = bench_readme.stale_blocks("", page, "cd" * 32)
    assert "bench-headline block shows figures that were measured on series digest" in problem


def test_a_stale_checkpoint_result_says_so_in_the_headline_instead_of_its_figures():
    old = {"fork": "1.8.6+xla.82.g00000000", "digest": "00" * 32, "date": "2026-12-05 06:00 UTC"}
    block = bench_readme.figures_block(None, None, "ab" * 32, _checkpoint(old), None)
    assert "Not current: results/checkpoint.json measured the fork 1.8.6+xla.82.g00000000" in " ".join(block.split())
    assert "results/llm.json is missing" in " ".join(block.split())
    assert "1.31" not in block
