"""Every result under results/ says what it measured (the fork's version with its series digest, the date, the
machine), and the pages quote only results of the series now in patches/1.8.6 (``forkq.bench_readme``)."""
import json
import struct
import zlib
from pathlib import Path

import pytest

from bench import report
from forkq import bench_readme, stamp as fork_stamp
from forkq.tree import fork_version

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "results"
OLD = "0" * 64


def _png_texts(path: Path):
    data, at, texts = path.read_bytes(), 8, {}
    while at < len(data):
        (length,), kind = struct.unpack(">I", data[at:at + 4]), data[at + 4:at + 8]
        body = data[at + 8:at + 8 + length]
        assert struct.unpack(">I", data[at + 8 + length:at + 12 + length])[0] == zlib.crc32(kind + body) & 0xFFFFFFFF
        if kind == b"tEXt":
            key, _, value = body.partition(b"\0")
            texts[key.decode()] = value.decode("latin-1")
        at += 12 + length
    return texts


@pytest.mark.parametrize("path", sorted(p.name for p in RESULTS.iterdir()))
def test_every_result_says_what_it_measured(path):
    path = RESULTS / path
    if path.suffix == ".json":
        stamp = json.loads(path.read_text())["stamp"]
        assert stamp["fork"].startswith("1.8.6+xla.") and stamp["date"] and stamp["machine"]
        # a digest of 64 hex digits, or None where the run's series is not in the history (and the fork says so)
        assert (stamp["digest"] is None and "digest unknown" in stamp["fork"]) or (
            len(stamp["digest"]) == 64 and stamp["fork"].endswith(".g" + stamp["digest"][:8]))
        md = path.with_suffix(".md")
        if md.exists():
            assert fork_stamp.line(stamp) in md.read_text().splitlines()[:3], f"{md.name} lacks its stamp line"
    elif path.suffix == ".md":
        assert path.read_text().splitlines()[2].startswith("_" + fork_stamp.LINE_PREFIX)
    elif path.suffix == ".png":
        assert _png_texts(path)["Description"].startswith("_" + fork_stamp.LINE_PREFIX)
    else:
        pytest.fail(f"results/{path.name}: no stamp for this kind of file")


def test_a_run_is_stamped_with_the_series_now_in_patches(tmp_path):
    stamp = report.stamp(tree="the fork installed in the venv")
    assert stamp["digest"] == fork_stamp.current_digest() and stamp["fork"] == fork_version()
    assert stamp["machine"]["cpus"] and stamp["tree"] == "the fork installed in the venv"
    report.write_json(tmp_path / "x.json", {"stamp": {"old": 1}, "rows": [1]}, stamp)
    written = json.loads((tmp_path / "x.json").read_text())
    assert list(written) == ["stamp", "rows"] and written["stamp"] == stamp
    old = dict(stamp, digest=OLD, fork="1.8.6+xla.1.g00000000")
    text = report.write_markdown_page(tmp_path / "x.md", "# Title\n\nbody\n", old)
    assert text == f"# Title\n\n{fork_stamp.line(old)}\n\nbody\n"
    # a new run's line replaces the old one
    again = report.stamped_markdown(text, stamp)
    assert again == f"# Title\n\n{fork_stamp.line(stamp)}\n\nbody\n"
    assert f"(series digest {stamp['digest'][:12]})" in again


def _page(block_begin, block_end, body):
    return f"intro\n{block_begin}\n{body}\n{block_end}\nend\n"


def test_the_check_fails_on_figures_of_another_series_and_names_the_command():
    now = "a" * 64
    old_line = fork_stamp.line({"fork": "1.8.6+xla.18.g00000000", "digest": OLD, "date": "2026-11-30"})
    new_line = fork_stamp.line({"fork": "1.8.6+xla.62.gaaaaaaaa", "digest": now, "date": "2026-12-03"})
    host = _page(bench_readme.HOST_BEGIN, bench_readme.HOST_END, f"{old_line}\n\n| pair | ... |")
    (problem,) = bench_readme.stale_blocks(host, "", now)
    assert "bench/README.md: its bench-host block" in problem and OLD[:12] in problem
    assert "`make bench-host` measures them again" in problem and "readme-bench" in problem
    assert bench_readme.stale_blocks(host.replace(old_line, new_line), "", now) == []
    # figures with no stamp at all are not current either
    (problem,) = bench_readme.stale_blocks("", _page(bench_readme.FIGURES_BEGIN, bench_readme.FIGURES_END,
                                                     "- the fork 0 / 1 / 1"), now)
    assert "README.md: its bench-headline block shows figures that carry no stamp: `make bench-graph`" in problem
    # a block that says it is not current quotes no figures
    said = bench_readme.not_current("device", "results/device.json measured the fork 1.8.6+xla.61.g91f5f1ce")
    top = _page(bench_readme.HEADLINE_BEGIN, bench_readme.HEADLINE_END, "- " + said)
    assert bench_readme.stale_blocks("", top, now) == []


def _bench_json(digest):
    def row(key, counts, s):
        return {"row": key, "sizes": {"small": {"measure": dict(zip(
            ("compiles_per_step", "executions_per_step", "transfers_per_step"), counts), s_per_step=s)}}}

    return {"stamp": {"fork": "1.8.6+xla.62.gaaaaaaaa", "digest": digest, "date": "2026-12-03 17:00 UTC"},
            "rows": [row("before", (2, 4, 4), 1.2485), row("fork", (0, 1, 1), 0.0068),
                     row("pl266", (0, 1, 2.0176), 0.0051)],
            "targets": [{"name": "small: fork / Lightning 2.6.6 (s/step)", "value": 1.06},
                        {"name": "heavy: fork / Lightning 2.6.6 (s/step)", "value": 1.0}],
            "pattern_targets": {"log-loss": [], "bf16": []}}


def test_readme_bench_quotes_current_results_and_says_which_are_not(tmp_path):
    now = "b" * 64
    results = tmp_path / "results"
    results.mkdir()
    bench = _bench_json(now)
    (results / "bench.json").write_text(json.dumps(bench))
    (results / "bench.md").write_text(f"# Graph benchmark\n\n{fork_stamp.line(bench['stamp'])}\n\n## small MLP\n\n"
                                      "| row | a |\n|---|---|\n| fork | 1 |\n")
    host = {"stamp": {"fork": "1.8.6+xla.54.g00000000", "digest": OLD, "date": "2026-12-01"},
            "summary": {"rows": [{"a": "fork", "b": "pl266", "ratio": 0.79, "diff_ms": -0.69}]}}
    (results / "host.json").write_text(json.dumps(host))
    (results / "host.md").write_text("# Host CPU per step\n\n| pair |\n")
    readme = "".join(_page(b, e, "old figures") for b, e in (
        (bench_readme.BEGIN, bench_readme.END), (bench_readme.PATTERNS_BEGIN, bench_readme.PATTERNS_END),
        (bench_readme.HOST_BEGIN, bench_readme.HOST_END), (bench_readme.DEVICE_BEGIN, bench_readme.DEVICE_END)))
    top = (_page(bench_readme.FIGURES_BEGIN, bench_readme.FIGURES_END, "- old")
           + _page(bench_readme.HEADLINE_BEGIN, bench_readme.HEADLINE_END, "- old"))
    # before: the check finds the old figures of every block
    assert len(bench_readme.stale_blocks(readme, top, now)) == 6
    new_readme, new_top, _ = bench_readme.render(readme, top, results, now)
    assert bench_readme.stale_blocks(new_readme, new_top, now) == []
    main = new_readme.split(bench_readme.BEGIN)[1].split(bench_readme.END)[0]
    assert "| fork | 1 |" in main and f"(series digest {now[:12]})" in main
    host_block = new_readme.split(bench_readme.HOST_BEGIN)[1].split(bench_readme.HOST_END)[0]
    assert host_block.startswith("\n_Not current: results/host.json measured the fork 1.8.6+xla.54.g00000000")
    assert "`make bench-host` measures it again._" in host_block and "| pair |" not in host_block
    device_block = new_readme.split(bench_readme.DEVICE_BEGIN)[1].split(bench_readme.DEVICE_END)[0]
    assert "results/device.json is missing" in device_block and "`make bench-device`" in device_block
    figures = " ".join(new_top.split(bench_readme.FIGURES_BEGIN)[1].split(bench_readme.FIGURES_END)[0].split())
    assert "upstream 1.8.6 (compat patches only) 2 / 4 / 4 (1248.5 ms a step); the fork 0 / 1 / 1" in figures
    assert "Lightning 2.6.6 0 / 1 / 2.02; every everyday pattern measured meets 0 / 1 / at most 1" in figures
    assert "1.06 on the small MLP, 1.00 on the wide one" in figures and f"(series digest {now[:12]})" in figures
    # the host figure (0.79) is not quoted: its run measured another series
    assert "0.79" not in figures and "_Not current: results/host.json" in figures


def test_the_pages_quote_only_results_of_the_current_series():
    """README.md and bench/README.md as committed: no block shows figures of a run of another series
    (``make check-series`` runs the same check)."""
    problems = bench_readme.stale_blocks((REPO / "bench" / "README.md").read_text(),
                                         (REPO / "README.md").read_text(), fork_stamp.current_digest())
    assert not problems, "\n".join(problems)


def test_a_current_device_run_too_short_to_quote_replaces_what_the_blocks_said_of_an_older_one(tmp_path):
    """A current 3-round ``make bench-device`` run is not quoted, and the blocks that still named an older run as the
    latest say which run is there and why it is not quoted; blocks with figures of the current series stay."""
    now = "c" * 64
    results = tmp_path / "results"
    results.mkdir()
    device = {"stamp": {"fork": "1.8.6+xla.63.gcccccccc", "digest": now, "date": "2026-12-03 20:45 UTC"},
              "meta": {"quick": False}, "result": {"rounds": 3}, "summary": {"ratios": []}}
    (results / "device.json").write_text(json.dumps(device))
    (results / "device.md").write_text("# Device-bound step\n\n| fork / idiom | **1.01** |\n")
    older = "_Not current: results/device.json measured the fork 1.8.6+xla.61.g91f5f1ce on 2026-12-02 11:06._"

    def pages(device_body):
        readme = "".join(_page(b, e, "old figures") for b, e in (
            (bench_readme.BEGIN, bench_readme.END), (bench_readme.PATTERNS_BEGIN, bench_readme.PATTERNS_END),
            (bench_readme.HOST_BEGIN, bench_readme.HOST_END)))
        return readme + _page(bench_readme.DEVICE_BEGIN, bench_readme.DEVICE_END, device_body)

    readme = pages(older)
    top = (_page(bench_readme.FIGURES_BEGIN, bench_readme.FIGURES_END, "- old")
           + _page(bench_readme.HEADLINE_BEGIN, bench_readme.HEADLINE_END, "- " + older))
    new_readme, new_top, what = bench_readme.render(readme, top, results, now)
    for text, begin, end in ((new_readme, bench_readme.DEVICE_BEGIN, bench_readme.DEVICE_END),
                             (new_top, bench_readme.HEADLINE_BEGIN, bench_readme.HEADLINE_END)):
        block = " ".join(text.split(begin)[1].split(end)[0].split())
        assert "xla.61" not in block and "**1.01**" not in block
        assert ("_Not quoted: results/device.json measured the fork 1.8.6+xla.63.gcccccccc (series digest "
                f"{now[:12]}) on 2026-12-03 20:45 UTC, but it is 3 rounds, fewer than 5") in block
        assert "`make bench-device` measures it again in 5 rounds or more._" in block
    assert "device-bound table and headline NOT QUOTED (results/device.json is 3 rounds, fewer than 5)" in what
    # a block that shows figures of the current series keeps them
    figures = f"| fork / idiom | **1.02** | (series digest {now[:12]})"
    assert figures in bench_readme.render(pages(figures), top, results, now)[0]
