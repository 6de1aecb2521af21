"""`fork.py materialize` when things go wrong: a second run at the same time, an interrupt, a read-only checkout,
a download that hangs, and a `src/` edited by hand.

The runs that must be interrupted or overlapped are real processes of the command line tool, working on a copy of
the tool inside a temporary queue (two small patches, the real lock, the pinned wheel copied into its cache).
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from forkq import common, tree, upstream
from tests_fork.upstream_queue import REPO, materialize_queue, queue, upstream_about  # noqa: F401 (fixtures)

# runs the copied tool's main(); SLOW_APPLY=<seconds> sleeps before every patch so a test can act mid-build
DRIVER = """
import os, signal, sys, time
# a runner started in the background has SIGINT ignored and children inherit that: Ctrl-C as a terminal delivers it
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.path.insert(0, os.path.dirname(sys.argv[1]))
from forkq import cli, tree
delay = float(os.environ.get("SLOW_APPLY", "0"))
real_apply = tree.apply_patch
def slow_apply(tree, patch):
    time.sleep(delay)
    real_apply(tree, patch)
tree.apply_patch = slow_apply
sys.exit(cli.main(sys.argv[2:]))
"""


@pytest.fixture
def cli_queue(queue):
    """The queue as a checkout of its own: tools/fork.py and tools/forkq copied in, the patches in patches/1.8.6, the
    pinned wheel already in its cache."""
    (queue / "tools").mkdir()
    shutil.copy2(REPO / "tools" / "fork.py", queue / "tools" / "fork.py")
    shutil.copytree(REPO / "tools" / "forkq", queue / "tools" / "forkq", ignore=shutil.ignore_patterns("__pycache__"))
    (queue / "patches" / "1.8.6").mkdir()
    for path in list((queue / "patches").iterdir()):
        if path.is_file():
            shutil.move(str(path), str(queue / "patches" / "1.8.6" / path.name))
    entry = upstream.read_lock()["pytorch-lightning"]
    cache = queue / ".cache" / "upstream"
    cache.mkdir(parents=True)
    shutil.copy2(upstream.fetch_wheel("pytorch-lightning", entry), cache / entry["filename"])
    (queue / "driver.py").write_text(DRIVER)
    return queue


def _start(queue: Path, *args: str, slow: float = 0.0, **env) -> subprocess.Popen:
    full_env = dict(os.environ, SLOW_APPLY=str(slow), **env)
    return subprocess.Popen([sys.executable, str(queue / "driver.py"), str(queue / "tools" / "fork.py"), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env)


def _finish(proc: subprocess.Popen, timeout: float = 120):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def _wait_for(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.05)


def _staging(queue: Path):
    return sorted(queue.glob(".fork-staging-*"))


def _version_file(src: Path) -> str:
    return (src / "pytorch_lightning" / "__version__.py").read_text().split('"')[1]


# --------------------------------------------------------------------------------------------- concurrency
def test_a_second_run_waits_for_the_first_or_gives_up_with_a_clear_message(cli_queue):
    first = _start(cli_queue, "materialize", slow=2.0)
    _wait_for(lambda: _staging(cli_queue))  # the first run holds the lock and is building
    impatient = _start(cli_queue, "materialize", FORK_LOCK_TIMEOUT="0.5")
    patient = _start(cli_queue, "materialize")
    code, _, err = _finish(impatient)
    assert code == 1, err
    assert f"another `fork.py materialize` (pid {first.pid}) is still writing" in err and "Traceback" not in err
    code, out, err = _finish(patient)
    assert code == 0, err
    assert f"another `fork.py materialize` (pid {first.pid}) is writing" in err and "waiting" in err
    assert "up to date" in out  # it found the tree the first run built, and did not build it again
    code, _, err = _finish(first)
    assert code == 0, err
    src = cli_queue / "src"
    assert tree.local_edits(src) == [] and tree.read_stamp(src)["complete"]
    assert _staging(cli_queue) == []


CHECK_NEVER_MISSING = """
import json, os, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from forkq import tree
queue = sys.argv[2]
dest = os.path.join(queue, "src")
kw = dict(lock_file=Path(queue, "upstream.lock"), patch_dir=Path(queue, "patches"), quiet=True)
tree.materialize(Path(dest), **kw)
state = {"armed": False, "busy": False, "events": 0, "missing": []}
def hook(event, args):
    # checked at every audited operation (open, rename, rmtree, listdir, subprocess...) of the rebuild
    if not state["armed"] or state["busy"]:
        return
    state["busy"] = True
    try:
        state["events"] += 1
        if not os.path.isdir(os.path.join(dest, "pytorch_lightning")):
            state["missing"].append(event)
    finally:
        state["busy"] = False
sys.addaudithook(hook)
state["armed"] = True
tree.materialize(Path(dest), force=True, **kw)
state["armed"] = False
print(json.dumps({"events": state["events"], "missing": state["missing"]}))
"""


def test_src_never_disappears_while_it_is_replaced(queue):
    proc = subprocess.run([sys.executable, "-c", CHECK_NEVER_MISSING, str(REPO / "tools"), str(queue)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["events"] > 100  # the hook saw the rebuild
    assert got["missing"] == [], f"src/ was missing during: {got['missing'][:5]}"
    assert tree.local_edits(queue / "src") == []


# --------------------------------------------------------------------------------------------- interrupts
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_an_interrupted_rebuild_leaves_no_staging_folder_and_the_old_tree(cli_queue, signum):
    code, _, err = _finish(_start(cli_queue, "materialize", "--upto", "0001"))
    assert code == 0, err
    src = cli_queue / "src"
    before = (src / tree.STAMP_NAME).read_text()
    run = _start(cli_queue, "materialize", slow=60.0)
    _wait_for(lambda: _staging(cli_queue))
    time.sleep(0.3)  # inside the build, sleeping before the first patch
    run.send_signal(signum)
    code, _, err = _finish(run, timeout=30)
    assert code == 128 + signum, err
    assert "interrupted" in err and "Traceback" not in err
    assert _staging(cli_queue) == []
    assert (src / tree.STAMP_NAME).read_text() == before and tree.local_edits(src) == []
    # and the lock went with the process: the next run does not wait
    code, _, err = _finish(_start(cli_queue, "materialize", FORK_LOCK_TIMEOUT="1"))
    assert code == 0 and "waiting" not in err, err


def test_a_staging_folder_left_by_a_killed_run_is_removed_by_the_next(queue):
    materialize_queue(queue)
    leftover = queue / ".fork-staging-src-killed"
    (leftover / "root" / "src").mkdir(parents=True)
    materialize_queue(queue, force=True)
    assert not leftover.exists()


# --------------------------------------------------------------------------------------------- read-only
def _read_only_cmd(root: Path, cmd: list) -> list:
    """``cmd`` run with ``root`` read-only: a read-only bind mount in a private mount namespace (as root, where
    file modes do not stop writes), or plain file modes for another user."""
    if os.geteuid() != 0:
        subprocess.run(["chmod", "-R", "a-w", str(root)], check=True)
        return cmd
    if not shutil.which("unshare") or subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode:
        pytest.skip("running as root without `unshare` to make a read-only mount")
    script = 'mount --bind "$1" "$1" && mount -o remount,ro,bind "$1" "$1" && shift && exec "$@"'
    return ["unshare", "-rm", "sh", "-c", script, "sh", str(root), *cmd]


def test_a_read_only_checkout_gets_a_clear_error_and_works_once_materialized(cli_queue, tmp_path_factory):
    tool = [sys.executable, str(cli_queue / "tools" / "fork.py")]
    # nothing to write: an up-to-date tree is fine in a read-only checkout
    code, _, err = _finish(_start(cli_queue, "materialize"))
    assert code == 0, err
    proc = subprocess.run(_read_only_cmd(cli_queue, [*tool, "materialize"]), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "up to date" in proc.stdout, proc.stderr
    # a tree to rebuild: a clear error that says what to do instead of a traceback
    subprocess.run(["chmod", "-R", "u+w", str(cli_queue)], check=True)
    patch = cli_queue / "patches" / "1.8.6" / "0002-second.patch"
    patch.write_text(patch.read_text().replace("SECOND = 2", "SECOND = 3"))
    proc = subprocess.run(_read_only_cmd(cli_queue, [*tool, "materialize"]), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "fork.py: error: cannot write to" in proc.stderr and "Traceback" not in proc.stderr
    assert "--dest" in proc.stderr and "--cache-dir" in proc.stderr
    # the advice works: the tree goes to a writable folder
    writable = tmp_path_factory.mktemp("writable")
    cache = writable / "cache"
    shutil.copytree(cli_queue / ".cache" / "upstream", cache)
    out = writable / "out" / "src"
    proc = subprocess.run(_read_only_cmd(cli_queue, [*tool, "materialize", "--dest", str(out), "--cache-dir",
                                                     str(cache)]), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (out / "pytorch_lightning" / "__about__.py").read_text().endswith("SECOND = 3\n")
    subprocess.run(["chmod", "-R", "u+w", str(cli_queue)], check=True)


# --------------------------------------------------------------------------------------------- the download
@pytest.fixture
def offline_pip(monkeypatch):
    """pip without this machine's configuration (extra indexes, find-links), so a test decides where it looks."""
    for key in list(os.environ):
        if key.startswith("PIP_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    return monkeypatch


@pytest.fixture
def silent_index():
    """A package index on the loopback address that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held = []
    stop = threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except socket.timeout:
                continue
            except OSError:
                return

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}/simple/"
    stop.set()
    thread.join(2)
    for conn in held:
        conn.close()
    server.close()


@pytest.mark.timeout(90)
def test_a_hanging_download_is_stopped_with_a_clear_message(offline_pip, silent_index, tmp_path, capsys):
    offline_pip.setenv("PIP_INDEX_URL", silent_index)
    offline_pip.setenv("FORK_DOWNLOAD_TIMEOUT", "4")
    entry = upstream.read_lock()["pytorch-lightning"]
    started = time.monotonic()
    with pytest.raises(common.ForkError) as err:
        upstream.fetch_wheel("pytorch-lightning", entry, cache_dir=tmp_path / "cache")
    assert time.monotonic() - started < 30
    message = str(err.value)
    assert "pytorch-lightning==1.8.6 did not finish within 4 s" in message and "FORK_DOWNLOAD_TIMEOUT" in message
    assert "downloading pytorch-lightning==1.8.6 with pip" in capsys.readouterr().err
    assert list((tmp_path / "cache").iterdir()) == []  # no partial download left


def test_the_download_shows_its_progress(offline_pip, tmp_path, capsys):
    entry = upstream.read_lock()["pytorch-lightning"]
    links = tmp_path / "links"
    links.mkdir()
    shutil.copy2(upstream.fetch_wheel("pytorch-lightning", entry), links / entry["filename"])
    offline_pip.setenv("PIP_NO_INDEX", "1")
    offline_pip.setenv("PIP_FIND_LINKS", str(links))
    wheel = upstream.fetch_wheel("pytorch-lightning", entry, cache_dir=tmp_path / "cache")
    assert upstream.sha256_file(wheel) == entry["sha256"]
    err = capsys.readouterr().err
    assert "fork.py: downloading pytorch-lightning==1.8.6 with pip" in err
    assert "  pip: " in err and entry["filename"] in err  # pip's own lines, passed through as they come
    assert f"fork.py: downloaded {entry['filename']}" in err


def test_a_bad_download_timeout_setting_is_refused(offline_pip, tmp_path):
    offline_pip.setenv("FORK_DOWNLOAD_TIMEOUT", "soon")
    with pytest.raises(common.ForkError, match="FORK_DOWNLOAD_TIMEOUT='soon' is not a number of seconds"):
        upstream.fetch_wheel("pytorch-lightning", upstream.read_lock()["pytorch-lightning"], cache_dir=tmp_path)


# --------------------------------------------------------------------------------------------- local edits
def test_an_edited_tree_is_marked_dirty_and_clean_again_once_reverted(queue, capsys):
    src = materialize_queue(queue)
    canonical = tree.read_stamp(src)["version"]
    assert _version_file(src) == canonical and tree.tree_version(src) == canonical
    about = src / "pytorch_lightning" / "__about__.py"
    original = about.read_text()
    about.write_text(original + "LOCAL = 1\n")
    (src / "lightning_lite" / "extra.py").write_text("X = 1\n")
    materialize_queue(queue)
    err = capsys.readouterr().err
    assert "modified: pytorch_lightning/__about__.py" in err and "added: lightning_lite/extra.py" in err
    assert tree.tree_version(src) == f"{canonical}.dirty" == _version_file(src)
    assert (src / "lightning_lite" / "__version__.py").read_text() == f'version = "{canonical}.dirty"\n'
    # the edits are kept (materialize is how `make install` / `make test` start) and the version says so
    assert about.read_text().endswith("LOCAL = 1\n")
    # reverted: the canonical version again
    about.write_text(original)
    (src / "lightning_lite" / "extra.py").unlink()
    materialize_queue(queue)
    assert tree.tree_version(src) == canonical == _version_file(src)


def test_a_removed_file_counts_as_an_edit(queue):
    src = materialize_queue(queue)
    (src / "pytorch_lightning" / "README.md").unlink()
    assert tree.local_edits(src) == ["removed: pytorch_lightning/README.md"]
    assert tree.tree_version(src).endswith(".dirty")


def test_an_edited_tree_is_never_rebuilt_away_without_force(queue):
    src = materialize_queue(queue)
    about = src / "pytorch_lightning" / "__about__.py"
    about.write_text(about.read_text() + "WORK_IN_PROGRESS = 1\n")
    with pytest.raises(common.ForkError) as err:
        materialize_queue(queue, upto="0001")
    message = str(err.value)
    assert "modified: pytorch_lightning/__about__.py" in message
    assert "make refresh PATCH=0002-second.patch" in message and "--force" in message
    assert about.read_text().endswith("WORK_IN_PROGRESS = 1\n")
    materialize_queue(queue, upto="0001", force=True)
    assert "WORK_IN_PROGRESS" not in about.read_text() and tree.local_edits(src) == []


def test_a_folder_not_written_by_the_tool_is_not_replaced(tmp_path, queue):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(common.ForkError, match="was not written by `fork.py materialize`"):
        tree.materialize(mine, lock_file=queue / "upstream.lock", patch_dir=queue / "patches", quiet=True)
    assert (mine / "notes.txt").read_text() == "keep me"
