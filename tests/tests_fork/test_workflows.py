"""The GitHub Actions workflows: correct (actionlint), safe (zizmor), and shaped as the TPU CI needs.

actionlint and zizmor are pinned in requirements/test.txt; both run offline. The checks are shown to bite on
deliberately broken workflows written to ``tmp_path``.
"""
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
WORKFLOWS = REPO / ".github" / "workflows"
TPU_WORKFLOW = WORKFLOWS / "tpu.yml"
CI_WORKFLOW = WORKFLOWS / "ci.yml"
SHA_PIN = re.compile(r"^[\w.-]+/[\w./-]+@[0-9a-f]{40}$")


def _tool(name: str) -> str:
    """The linter from this interpreter's environment (where requirements/test.txt put it), else from PATH."""
    candidate = Path(sys.executable).parent / name
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if not found:
        pytest.fail(f"`{name}` is not installed: `pip install -r requirements/test.txt` (it is pinned there)")
    return found


def _actionlint(*files: Path) -> list:
    """actionlint's errors for ``files`` as dicts (message, filepath, line, kind)."""
    proc = subprocess.run([_tool("actionlint"), "-no-color", "-format", "{{json .}}", *map(str, files)],
                          capture_output=True, text=True, cwd=files[0].parent, timeout=120)
    if proc.returncode not in (0, 1) or (proc.returncode == 1 and not proc.stdout.strip()):
        pytest.fail(f"actionlint failed to run (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return json.loads(proc.stdout or "[]")


def _zizmor(target: Path) -> list:
    """zizmor's findings for ``target`` (offline: no GitHub API, no token)."""
    env = {k: v for k, v in os.environ.items() if k not in ("GH_TOKEN", "GITHUB_TOKEN", "ZIZMOR_GITHUB_TOKEN")}
    proc = subprocess.run([_tool("zizmor"), "--offline", "--no-progress", "--format", "json", str(target)],
                          capture_output=True, text=True, env=env, timeout=120)
    # zizmor exits non-zero when it has findings (10 + the highest severity); its JSON is on stdout either way
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"zizmor gave no JSON (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")


def _high(findings: list) -> list:
    return [f for f in findings if f["determinations"]["severity"].lower() == "high" and not f.get("ignored")]


def _load(path: Path) -> dict:
    data = yaml.safe_load(path.read_text())
    # YAML 1.1 reads the key `on` as the boolean True
    data["on"] = data.pop(True, data.get("on"))
    return data


def _steps(workflow: dict):
    for job_name, job in workflow["jobs"].items():
        for step in job.get("steps", []):
            yield job_name, step


BAD_WORKFLOW = """\
name: bad
on:
  pull_request_target:
jobs:
  test:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@v4
        with:
          ref: ${{ github.event.pull_request.head.sha }}
      - run: echo "${{ github.event.pull_request.title }}"
      - run: make test
        env:
          CLOUD_KEY: ${{ secrets.CLOUD_KEY }}
"""


# --------------------------------------------------------------------------------------------- actionlint
def test_actionlint_accepts_both_workflows():
    assert TPU_WORKFLOW.exists() and CI_WORKFLOW.exists()
    errors = _actionlint(CI_WORKFLOW, TPU_WORKFLOW)
    assert errors == [], "actionlint:\n" + "\n".join(f"{e['filepath']}:{e['line']}: {e['message']}" for e in errors)


def test_actionlint_flags_a_broken_workflow(tmp_path):
    wf = tmp_path / ".github" / "workflows"
    wf.mkdir(parents=True)
    broken = wf / "broken.yml"
    broken.write_text(BAD_WORKFLOW.replace("runs-on: ubuntu-latest", "runs-on: ubuntu-latest\n    timeout: 5")
                      .replace("run: make test", "run: make ${{ matrix.target }}"))
    errors = _actionlint(broken)
    messages = "\n".join(e["message"] for e in errors)
    assert any(e["kind"] == "syntax-check" for e in errors), messages  # unknown key `timeout`
    assert "property \"target\" is not defined" in messages  # matrix.target without a matrix
    assert "potentially untrusted" in messages  # the PR title inside a script


# --------------------------------------------------------------------------------------------- zizmor
def test_zizmor_finds_nothing_of_high_severity():
    findings = _zizmor(WORKFLOWS)
    high = _high(findings)
    assert high == [], "zizmor HIGH findings:\n" + "\n".join(
        f"{f['ident']}: {f['desc']} ({f['locations'][0]['symbolic']['key']})" for f in high)


def test_zizmor_flags_the_pull_request_target_hole(tmp_path):
    wf = tmp_path / ".github" / "workflows"
    wf.mkdir(parents=True)
    (wf / "bad.yml").write_text(BAD_WORKFLOW)
    high = {f["ident"] for f in _high(_zizmor(wf / "bad.yml"))}
    assert {"dangerous-triggers", "template-injection", "unpinned-uses"} <= high, high


# --------------------------------------------------------------------------------------------- shape
def test_every_action_is_pinned_to_a_commit_and_checkout_drops_its_token():
    for path in (CI_WORKFLOW, TPU_WORKFLOW):
        for job, step in _steps(_load(path)):
            uses = step.get("uses")
            if not uses:
                continue
            assert SHA_PIN.match(uses), f"{path.name}/{job}: {uses} is not pinned to a full commit SHA"
            if uses.startswith("actions/checkout@"):
                assert step.get("with", {}).get("persist-credentials") is False, f"{path.name}/{job}: {uses}"


def test_no_expression_is_expanded_inside_a_script():
    for path in (CI_WORKFLOW, TPU_WORKFLOW):
        for job, step in _steps(_load(path)):
            assert "${{" not in step.get("run", ""), f"{path.name}/{job}/{step.get('name')}: pass it through env"


def test_tpu_workflow_triggers_and_permissions():
    wf = _load(TPU_WORKFLOW)
    on = wf["on"]
    assert "pull_request_target" not in on and "workflow_run" not in on
    assert on["push"]["branches"] == ["main"]
    assert "labeled" in on["pull_request"]["types"]
    inputs = on["workflow_dispatch"]["inputs"]
    for name in ("accelerator_type", "runtime_version", "zone"):
        assert inputs[name].get("default"), name
    assert wf["permissions"] == {"contents": "read"}
    for name, job in wf["jobs"].items():
        # the label gates pull requests; pushes and manual runs always go
        assert "'tpu'" in job["if"] and "pull_request" in job["if"], name
        assert set(job["permissions"].items()) <= {("contents", "read"), ("id-token", "write")}, name
    # defaults are consistent: a v5e type with the v5e runtime in a zone that offers v5e
    env = wf["env"]
    assert "v5litepod-8" in env["ACCELERATOR_TYPE"] and inputs["accelerator_type"]["default"] == "v5litepod-8"
    assert "v2-alpha-tpuv5-lite" in env["RUNTIME_VERSION"] and "us-west4-a" in env["ZONE"]


def test_tpu_job_creates_tests_and_always_deletes_its_vm():
    wf = _load(TPU_WORKFLOW)
    steps = wf["jobs"]["tpu-tests"]["steps"]
    runs = [s.get("run", "") for s in steps]

    def index(pattern):
        hits = [i for i, run in enumerate(runs) if re.search(pattern, run)]
        assert hits, pattern
        return hits[0]

    create = index(r"gcloud compute tpus tpu-vm create")
    assert re.search(r"--spot|--preemptible", runs[create])
    for flag in ("--accelerator-type=", "--version=", "--zone=", "--labels="):
        assert flag in runs[create], flag
    test = index(r"bash scripts/tpu_vm_test\.sh")
    delete = index(r"gcloud compute tpus tpu-vm delete")
    assert create < test < delete
    assert steps[delete].get("if") == "always()"
    upload = [i for i, s in enumerate(steps) if s.get("uses", "").startswith("actions/upload-artifact@")]
    assert upload and steps[upload[0]].get("if") == "always()"
    # credentials come from secrets through the auth action, never from the file
    auth = [s for s in steps if s.get("uses", "").startswith("google-github-actions/auth@")]
    assert auth and all(v.startswith("${{ secrets.") for v in auth[0]["with"].values())
    assert "credentials_json" not in auth[0]["with"]
    reap = wf["jobs"]["reap"]
    assert any("scripts/reap_tpu_vms.sh" in s.get("run", "") for s in reap["steps"])


def test_ci_workflow_runs_the_readme_test_command_on_every_push():
    wf = _load(CI_WORKFLOW)
    assert "push" in wf["on"] and not (wf["on"]["push"] or {}).get("branches")
    assert any(s.get("run", "").strip() == "make test" for _, s in _steps(wf))


# --------------------------------------------------------------------------------------------- scripts
def _fake_gcloud(tmp_path: Path, listing: list) -> Path:
    """A `gcloud` that prints ``listing`` for `tpu-vm list` and records every call."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "listing.json").write_text(json.dumps(listing))
    script = bin_dir / "gcloud"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> "{tmp_path}/calls.log"\n'
        'case "$*" in *"tpu-vm list"*) cat "' + str(tmp_path / "listing.json") + '";; esac\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def test_reaper_deletes_only_old_vms_of_the_ci(tmp_path):
    now = datetime.now(timezone.utc)

    def node(name, hours_ago, labels):
        stamp = (now - timedelta(hours=hours_ago)).strftime("%Y-%m-%dT%H:%M:%S.%f") + "123Z"  # nanoseconds
        return {"name": f"projects/p/locations/us-west4-a/nodes/{name}", "createTime": stamp, "labels": labels}

    ci = {"purpose": "lightning-xla-ci"}
    listing = [
        node("old-ci", 7, ci),
        node("fresh-ci", 1, ci),
        node("old-other", 30, {"purpose": "someone-else"}),
        node("old-unlabelled", 30, None),
    ]
    bin_dir = _fake_gcloud(tmp_path, listing)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", ZONE="us-west4-a",
               REAP_ZONES="us-west4-a us-central1-a", VM_LABEL="purpose=lightning-xla-ci", MAX_AGE_HOURS="6")
    proc = subprocess.run(["bash", str(REPO / "scripts" / "reap_tpu_vms.sh")], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    calls = (tmp_path / "calls.log").read_text().splitlines()
    deletes = [c for c in calls if "tpu-vm delete" in c]
    # the same listing comes back for both zones: old-ci once per zone, nothing else
    assert deletes == [
        "compute tpus tpu-vm delete old-ci --zone=us-west4-a --quiet --async",
        "compute tpus tpu-vm delete old-ci --zone=us-central1-a --quiet --async",
    ]
    assert sum("tpu-vm list" in c for c in calls) == 2  # ZONE is not listed twice


def test_tpu_vm_script_is_valid_bash_and_installs_the_readme_way():
    script = REPO / "scripts" / "tpu_vm_test.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    for needle in ("make venv", "make install", "export PJRT_DEVICE=TPU", '-m "xla or tpu"', "--junitxml="):
        assert needle in text, needle


def test_the_ddp_replica_test_is_selected_by_the_tpu_run():
    """The TPU script selects `-m "xla or tpu"`: the DDP replica test must carry the `tpu` mark."""
    import importlib.util

    path = REPO / "tests" / "tests_pytorch" / "tpu" / "test_ddp_sync.py"
    spec = importlib.util.spec_from_file_location("ddp_sync_under_check", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    marks = {m.name for m in module.test_replicas_stay_in_sync_and_match_one_device.pytestmark}
    assert "tpu" in marks, marks
    assert module.FIXED_BY == "0004-tpu-reduce-gradients-inside-the-closure.patch"
