"""The GitHub Actions workflows: correct (actionlint), safe (zizmor), and shaped as the TPU CI needs.

actionlint and zizmor are pinned in requirements/test.txt; both run offline. The checks are shown to bite on
deliberately broken workflows written to ``tmp_path``.
"""
import ast
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
def test_zizmor_finds_nothing():
    findings = [f for f in _zizmor(WORKFLOWS) if not f.get("ignored")]
    assert findings == [], "zizmor findings:\n" + "\n".join(
        f"{f['ident']} ({f['determinations']['severity']}): {f['desc']} ({f['locations'][0]['symbolic']['key']})"
        for f in findings)


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
    assert "labeled" in on["pull_request"]["types"] and "unlabeled" not in on["pull_request"]["types"]
    inputs = on["workflow_dispatch"]["inputs"]
    assert set(inputs) == {"accelerator_type", "zone", "evidence"}  # the runtime version follows from the type
    for name in ("accelerator_type", "zone"):
        assert inputs[name]["type"] == "choice" and inputs[name]["default"] in inputs[name]["options"], name
    assert wf["permissions"] == {"contents": "read"}
    for name, job in wf["jobs"].items():
        assert set(job["permissions"].items()) <= {("contents", "read"), ("id-token", "write")}, name
    # only the jobs that need the cloud get an OIDC token, and each in an environment
    for name, job in wf["jobs"].items():
        if job["permissions"].get("id-token"):
            assert job.get("environment") in ("tpu", "tpu-reaper"), name
    assert "id-token" not in wf["jobs"]["config"]["permissions"] and "environment" not in wf["jobs"]["config"]
    assert wf["jobs"]["tpu-tests"]["needs"] == "config"


def test_tpu_job_creates_tests_and_always_deletes_its_vm():
    wf = _load(TPU_WORKFLOW)
    steps = wf["jobs"]["tpu-tests"]["steps"]
    runs = [s.get("run", "") for s in steps]

    def index(pattern):
        hits = [i for i, run in enumerate(runs) if re.search(pattern, run)]
        assert len(hits) == 1, pattern
        return hits[0]

    create = index(r"bash scripts/create_tpu_vm\.sh")
    test = index(r"bash scripts/tpu_vm_test\.sh")
    delete = index(r"bash scripts/delete_tpu_vm\.sh")
    assert create < test < delete
    assert steps[delete]["if"].startswith("always()")
    upload = [i for i, s in enumerate(steps) if s.get("uses", "").startswith("actions/upload-artifact@")]
    assert upload and steps[upload[0]].get("if") == "always()"
    # credentials come from secrets through the auth action, never from the file
    for job in ("tpu-tests", "reap"):
        auth = [s for s in wf["jobs"][job]["steps"] if s.get("uses", "").startswith("google-github-actions/auth@")]
        assert auth and all(v.startswith("${{ secrets.") for v in auth[0]["with"].values()), job
        assert "credentials_json" not in auth[0]["with"], job


def test_tpu_job_runs_the_device_bound_benchmark_on_the_tpu_and_brings_it_back():
    steps = _load(TPU_WORKFLOW)["jobs"]["tpu-tests"]["steps"]
    runs = [s.get("run", "") for s in steps]
    bench = [i for i, run in enumerate(runs) if "-m bench.device_bench" in run]
    assert len(bench) == 1
    run = runs[bench[0]]
    # on the TPU itself, with the TPU's own XLA settings (the one-thread flag is for XLA:CPU only)
    assert "PJRT_DEVICE=TPU .venv/bin/python -m bench.device_bench" in run and "XLA_FLAGS" not in run
    test = next(i for i, r in enumerate(runs) if "scripts/tpu_vm_test.sh" in r)
    delete = next(i for i, r in enumerate(runs) if "scripts/delete_tpu_vm.sh" in r)
    assert test < bench[0] < delete
    out_dir = re.search(r"--out (\S+)/device\.json", run).group(1)
    assert f"--md {out_dir}/device.md" in run
    fetch = next(r for r in runs if "results.tar.gz" in r and "find " in r)
    assert out_dir in fetch.split()


# --------------------------------------------------------------------------------------------- when jobs run
class _Expr:
    """A small evaluator of the GitHub Actions expression syntax that the workflows use: literals, property paths
    (with ``.*`` filters), ``!``, ``==``, ``!=``, ``&&``, ``||``, parentheses and ``contains()``."""

    TOKEN = re.compile(r"\s*('(?:[^']|'')*'|\d+(?:\.\d+)?|&&|\|\||==|!=|[()!.,*\[\]]|[A-Za-z_][A-Za-z0-9_-]*)")

    def __init__(self, text: str, context: dict):
        self.tokens, pos, text = [], 0, text.strip()
        while pos < len(text):
            m = self.TOKEN.match(text, pos)
            assert m and m.end() > pos, f"cannot read {text[pos:]!r}"
            self.tokens.append(m.group(1))
            pos = m.end()
            while pos < len(text) and text[pos].isspace():
                pos += 1
        self.i, self.context = 0, context

    def value(self):
        result = self.or_()
        assert self.i == len(self.tokens), self.tokens[self.i:]
        return result

    def peek(self):
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, expected=None):
        token = self.tokens[self.i]
        assert expected is None or token == expected, (token, expected)
        self.i += 1
        return token

    def or_(self):
        left = self.and_()
        while self.peek() == "||":
            self.take()
            right = self.and_()
            left = left if _truthy(left) else right
        return left

    def and_(self):
        left = self.cmp()
        while self.peek() == "&&":
            self.take()
            right = self.cmp()
            left = right if _truthy(left) else left
        return left

    def cmp(self):
        left = self.unary()
        while self.peek() in ("==", "!="):
            op = self.take()
            right = self.unary()
            left = _equal(left, right) == (op == "==")
        return left

    def unary(self):
        if self.peek() == "!":
            self.take()
            return not _truthy(self.unary())
        return self.primary()

    def primary(self):
        token = self.take()
        if token == "(":
            inner = self.or_()
            self.take(")")
            return inner
        if token.startswith("'"):
            return token[1:-1].replace("''", "'")
        if token[0].isdigit():
            return float(token)
        if token in ("true", "false", "null"):
            return {"true": True, "false": False, "null": None}[token]
        if self.peek() == "(":
            self.take("(")
            args = []
            while self.peek() != ")":
                args.append(self.or_())
                if self.peek() == ",":
                    self.take()
            self.take(")")
            assert token == "contains", token
            haystack, needle = args
            if isinstance(haystack, list):
                return any(_equal(item, needle) for item in haystack)
            return str(needle).lower() in str(haystack or "").lower()
        value, mapped = self.context.get(token), False
        while self.peek() in (".", "["):
            if self.take() == "[":
                key = self.or_()
                self.take("]")
            else:
                key = self.take()
            if key == "*":
                value = list(value.values()) if isinstance(value, dict) else list(value or [])
                mapped = True
            elif mapped:
                value = [item.get(key) if isinstance(item, dict) else None for item in value]
            else:
                value = value.get(key) if isinstance(value, dict) else None
        return value


def _truthy(value) -> bool:
    return value not in (None, False, 0, "") if not isinstance(value, (list, dict)) else True


def _equal(a, b) -> bool:
    if isinstance(a, str) and isinstance(b, str):
        return a.lower() == b.lower()
    return a == b


def _evaluate(expression, context: dict):
    """A job's `if` (with or without ``${{ }}``) or a value with ``${{ }}`` templates inside."""
    text = str(expression).strip()
    if "${{" not in text:
        return _Expr(text, context).value()
    if text.startswith("${{") and text.endswith("}}") and text.count("${{") == 1:
        return _Expr(text[3:-2], context).value()
    return re.sub(r"\$\{\{(.*?)\}\}", lambda m: str(_Expr(m.group(1), context).value()), text, flags=re.S)


def _event(name: str, action: str = None, labels=(), label: str = None, fork: bool = False, ref=None) -> dict:
    event = {}
    if name == "pull_request":
        event = {"action": action, "pull_request": {
            "labels": [{"name": n} for n in labels],
            "head": {"repo": {"full_name": "someone/fork" if fork else "owner/repo"}}}}
        if label:
            event["label"] = {"name": label}
        ref = ref or "refs/pull/7/merge"
    return {"github": {"event_name": name, "event": event, "ref": ref or "refs/heads/main", "repository": "owner/repo",
                       "run_id": 1234}, "inputs": {}}


def _jobs_that_run(workflow: dict, context: dict) -> set:
    """The jobs of ``workflow`` that run for the event of ``context`` (all in the file's order; `needs` first)."""
    jobs = workflow["jobs"]
    ran, pending = set(), list(jobs)
    while pending:
        name = pending.pop(0)
        needs = jobs[name].get("needs")
        needs = [needs] if isinstance(needs, str) else (needs or [])
        if any(n in pending for n in needs):
            pending.append(name)
            continue
        if any(n not in ran for n in needs):
            continue  # a job whose needs were skipped is skipped (no status function in these `if`s)
        ctx = dict(context, needs={n: {"result": "success"} for n in needs})
        if _truthy(_evaluate(jobs[name].get("if", "true"), ctx)):
            ran.add(name)
    return ran


# event -> (does a run create a TPU VM (the tpu-tests job), does it reap)
CASES = {
    "push to main": (_event("push"), {"tpu-tests"}),
    "run by hand": (_event("workflow_dispatch"), {"tpu-tests", "reap"}),
    "the schedule": (_event("schedule"), {"reap"}),
    "pull request without the label": (_event("pull_request", "opened", labels=["docs"]), set()),
    "the tpu label added": (_event("pull_request", "labeled", labels=["tpu"], label="tpu"), {"tpu-tests"}),
    "another label added to a tpu pull request": (
        _event("pull_request", "labeled", labels=["tpu", "docs"], label="docs"), set()),
    "a push to a tpu pull request": (_event("pull_request", "synchronize", labels=["tpu"]), {"tpu-tests"}),
    "a fork's pull request with the label": (
        _event("pull_request", "labeled", labels=["tpu"], label="tpu", fork=True), set()),
}


@pytest.mark.parametrize("case", list(CASES))
def test_which_jobs_run_for_each_event(case):
    context, expected = CASES[case]
    wf = _load(TPU_WORKFLOW)
    if context["github"]["event_name"] not in wf["on"]:
        pytest.fail(f"the workflow has no {context['github']['event_name']} trigger")
    assert _jobs_that_run(wf, context) & {"tpu-tests", "reap"} == expected


def test_an_unrelated_label_event_cannot_cancel_a_running_tpu_job():
    wf = _load(TPU_WORKFLOW)
    conc = wf["concurrency"]

    def group(context):
        return _evaluate(conc["group"], context)

    running = group(_event("pull_request", "synchronize", labels=["tpu"]))
    assert group(_event("pull_request", "labeled", labels=["tpu", "docs"], label="docs")) != running
    assert group(_event("pull_request", "labeled", labels=["tpu"], label="tpu")) == running  # a new tpu run replaces
    # the hourly reaper and a run on main do not cancel each other
    assert group(_event("schedule")) != group(_event("push"))
    assert _evaluate(conc["cancel-in-progress"], _event("schedule")) is False
    assert _evaluate(conc["cancel-in-progress"], _event("push")) is True


def test_the_reaper_is_scheduled_in_an_environment_of_its_own():
    wf = _load(TPU_WORKFLOW)
    crons = [entry["cron"] for entry in wf["on"]["schedule"]]
    assert crons and all(len(c.split()) == 5 for c in crons)
    reap = wf["jobs"]["reap"]
    assert reap["environment"] == "tpu-reaper" != wf["jobs"]["tpu-tests"]["environment"]
    assert any("scripts/reap_tpu_vms.sh" in s.get("run", "") for s in reap["steps"])
    # it looks in every zone a run may use
    allowed_zones = {line.split()[1] for line in _config_list() if line.startswith("zone ")}
    assert allowed_zones <= set(wf["env"]["REAP_ZONES"].split())


# --------------------------------------------------------------------------------------------- inputs
def _config_list() -> list:
    return subprocess.run(["bash", str(REPO / "scripts" / "tpu_ci_config.sh"), "--list"], capture_output=True,
                          text=True, check=True).stdout.splitlines()


def _config(**env) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("ACCELERATOR_TYPE", "ZONE")}
    return subprocess.run(["bash", str(REPO / "scripts" / "tpu_ci_config.sh")], env=dict(full, **env),
                          capture_output=True, text=True, timeout=30)


def test_accelerator_types_and_zones_come_from_an_allow_list_of_single_host_slices():
    ok = _config()
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.splitlines() == ["accelerator_type=v5litepod-8", "runtime_version=v2-alpha-tpuv5-lite",
                                      "zone=us-west4-a"]
    ok = _config(ACCELERATOR_TYPE="v4-8")
    assert "runtime_version=tpu-ubuntu2204-base" in ok.stdout and "zone=us-central2-b" in ok.stdout
    for bad, message in [
        ({"ACCELERATOR_TYPE": "v5litepod-16"}, "accelerator type 'v5litepod-16' is not allowed"),  # two hosts
        ({"ACCELERATOR_TYPE": "v4-32"}, "not allowed"),
        ({"ACCELERATOR_TYPE": "v5litepod-8 --scopes=cloud-platform"}, "not allowed"),
        ({"ACCELERATOR_TYPE": "v4-8", "ZONE": "us-west4-a"}, "zone 'us-west4-a' does not offer 'v4-8'"),
        ({"ZONE": "europe-west4-a"}, "does not offer"),
    ]:
        proc = _config(**bad)
        assert proc.returncode == 1 and proc.stdout == "", (bad, proc.stdout)
        assert proc.stderr.startswith("::error") and message in proc.stderr, (bad, proc.stderr)
    # a value cannot smuggle a workflow command into the log through the error message
    proc = _config(ACCELERATOR_TYPE="x\n::add-mask::secret")
    assert proc.returncode == 1 and "\n::add-mask::" not in proc.stderr


def test_the_workflow_offers_exactly_the_allowed_choices_and_uses_the_checked_values():
    wf = _load(TPU_WORKFLOW)
    listed = _config_list()
    inputs = wf["on"]["workflow_dispatch"]["inputs"]
    assert sorted(inputs["accelerator_type"]["options"]) == sorted(l.split()[1] for l in listed if l.startswith("type "))
    assert sorted(inputs["zone"]["options"]) == sorted(l.split()[1] for l in listed if l.startswith("zone "))
    config = wf["jobs"]["config"]
    check = [s for s in config["steps"] if "tpu_ci_config.sh" in s.get("run", "")]
    assert check and '"$GITHUB_OUTPUT"' in check[0]["run"]
    env = wf["jobs"]["tpu-tests"]["env"]
    for key, output in (("ACCELERATOR_TYPE", "accelerator_type"), ("RUNTIME_VERSION", "runtime_version"),
                        ("ZONE", "zone")):
        assert env[key] == f"${{{{ needs.config.outputs.{output} }}}}", key
    # nothing else in the workflow reads the raw inputs
    text = TPU_WORKFLOW.read_text()
    assert text.count("inputs.accelerator_type") == 1 and text.count("inputs.zone") == 1


# --------------------------------------------------------------------------------------------- the VM's steps
FAKE_GCLOUD = """#!/bin/sh
echo "$*" >> "$FAKE_DIR/calls.log"
case "$*" in
  *"tpu-vm list"*) [ -n "$FAKE_LIST_FAIL" ] && { echo "ERROR: list failed" >&2; exit 1; }; cat "$FAKE_DIR/listing.json" ;;
  *"tpu-vm describe"*) [ -n "$FAKE_DESCRIBE_ERR" ] && { echo "$FAKE_DESCRIBE_ERR" >&2; exit 1; }; echo READY ;;
  *"tpu-vm delete"*) [ -n "$FAKE_DELETE_FAIL" ] && { echo "ERROR: delete failed" >&2; exit 1; }; echo deleted ;;
  *"tpu-vm create"*) echo created ;;
esac
exit 0
"""


def _fake_gcloud(tmp_path: Path, listing: list = ()) -> Path:
    """A `gcloud` that records every call; its answers are set through FAKE_* variables."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "listing.json").write_text(json.dumps(list(listing)))
    script = bin_dir / "gcloud"
    script.write_text(FAKE_GCLOUD)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def _calls(tmp_path: Path) -> list:
    log = tmp_path / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def _step(name_pattern: str) -> dict:
    steps = _load(TPU_WORKFLOW)["jobs"]["tpu-tests"]["steps"]
    found = [s for s in steps if re.search(name_pattern, s.get("name", ""))]
    assert len(found) == 1, name_pattern
    return found[0]


def _run_step(step: dict, tmp_path: Path, **env) -> subprocess.CompletedProcess:
    """Run a workflow step's script as the runner would, with the fake gcloud and ``env`` (its env values are set
    by the test: they are expressions in the file)."""
    bin_dir = tmp_path / "bin" if (tmp_path / "bin").exists() else _fake_gcloud(tmp_path)
    full = {k: v for k, v in os.environ.items() if not k.startswith(("VM_", "FAKE_"))}
    full.update(PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_DIR=str(tmp_path), GITHUB_RUN_ID="99", **env)
    return subprocess.run(["bash", "-e", "-c", step["run"]], cwd=REPO, env=full, capture_output=True, text=True,
                          timeout=60)


VM = dict(VM_NAME="lxla-ci-99-1", ZONE="us-west4-a", ACCELERATOR_TYPE="v5litepod-8",
          RUNTIME_VERSION="v2-alpha-tpuv5-lite", VM_LABEL="purpose=lightning-xla-ci")
SA = "lxla-tpu-vm@my-project.iam.gserviceaccount.com"


def test_the_vm_runs_as_a_dedicated_service_account_with_minimal_scopes(tmp_path):
    step = _step(r"^Create the TPU VM")
    assert step["env"]["VM_SERVICE_ACCOUNT"] == "${{ vars.TPU_VM_SERVICE_ACCOUNT }}"
    assert step["env"]["VM_SCOPES"] == "${{ vars.TPU_VM_SCOPES }}"
    proc = _run_step(step, tmp_path, VM_SERVICE_ACCOUNT=SA, VM_SCOPES="", **VM)
    assert proc.returncode == 0, proc.stderr
    (create,) = [c for c in _calls(tmp_path) if "tpu-vm create" in c]
    assert f"--service-account={SA}" in create.split()
    assert "--scopes=https://www.googleapis.com/auth/logging.write" in create.split()
    for flag in ("--spot", "--accelerator-type=v5litepod-8", "--version=v2-alpha-tpuv5-lite", "--zone=us-west4-a",
                 "--labels=purpose=lightning-xla-ci,run=99"):
        assert flag in create.split(), flag
    # every creation in the workflow goes through that step
    assert sum("tpu-vm create" in s.get("run", "") or "create_tpu_vm.sh" in s.get("run", "")
               for _, s in _steps(_load(TPU_WORKFLOW))) == 1


@pytest.mark.parametrize("account,scopes,message", [
    ("", "", "no service account for the VM"),
    ("123456789-compute@developer.gserviceaccount.com", "", "the project's default compute identity"),
    ("someone@example.com", "", "is not a service account address"),
    (SA, "https://www.googleapis.com/auth/cloud-platform", "reaches every API"),
    (SA, "https://www.googleapis.com/auth/logging.write,storage-full", "is not an OAuth scope URL"),
], ids=["unset", "default-compute", "not-a-service-account", "all-apis-scope", "bad-scope"])
def test_a_vm_identity_that_is_not_least_privilege_is_refused_before_creation(tmp_path, account, scopes, message):
    proc = _run_step(_step(r"^Create the TPU VM"), tmp_path, VM_SERVICE_ACCOUNT=account, VM_SCOPES=scopes, **VM)
    assert proc.returncode != 0
    assert "::error" in proc.stderr and message in proc.stderr, proc.stderr
    assert not [c for c in _calls(tmp_path) if "create" in c]


@pytest.mark.parametrize("situation", ["exists", "never-created", "describe-fails", "delete-fails"])
def test_the_delete_step_never_skips_silently(tmp_path, situation):
    step = _step(r"^Delete the TPU VM")
    assert step["if"].startswith("always()")
    env = {"never-created": {"FAKE_DESCRIBE_ERR": "ERROR: (gcloud.compute.tpus.tpu-vm.describe) NOT_FOUND: "
                                                  "Resource 'projects/p/locations/z/nodes/n' was not found"},
           "describe-fails": {"FAKE_DESCRIBE_ERR": "ERROR: (gcloud.compute.tpus.tpu-vm.describe) PERMISSION_DENIED"},
           "delete-fails": {"FAKE_DELETE_FAIL": "1"}}.get(situation, {})
    proc = _run_step(step, tmp_path, VM_NAME="lxla-ci-99-1", ZONE="us-west4-a", **env)
    deletes = [c for c in _calls(tmp_path) if "tpu-vm delete" in c]
    if situation == "exists":
        assert proc.returncode == 0, proc.stderr
        assert deletes == ["compute tpus tpu-vm delete lxla-ci-99-1 --zone=us-west4-a --quiet"]
    elif situation == "never-created":
        assert proc.returncode == 0 and "never created" in proc.stdout and deletes == []
    else:
        # the VM may still exist: the step fails, with an error annotation that says so
        assert proc.returncode != 0 and "::error" in proc.stderr, (proc.stdout, proc.stderr)
        assert "PERMISSION_DENIED" in proc.stderr if situation == "describe-fails" else "delete" in proc.stderr


def _reap(tmp_path: Path, listing: list, **env) -> subprocess.CompletedProcess:
    bin_dir = _fake_gcloud(tmp_path, listing)
    full = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_")}
    full.update(PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_DIR=str(tmp_path), ZONE="us-west4-a",
                REAP_ZONES="us-west4-a us-central1-a", VM_LABEL="purpose=lightning-xla-ci", MAX_AGE_HOURS="6", **env)
    return subprocess.run(["bash", str(REPO / "scripts" / "reap_tpu_vms.sh")], env=full, capture_output=True,
                          text=True, timeout=60)


def _node(name, hours_ago, labels):
    stamp = (datetime.now(timezone.utc) - timedelta(hours=hours_ago)).strftime("%Y-%m-%dT%H:%M:%S.%f") + "123Z"
    return {"name": f"projects/p/locations/us-west4-a/nodes/{name}", "createTime": stamp, "labels": labels}


CI_LABEL = {"purpose": "lightning-xla-ci"}


def test_reaper_deletes_only_old_vms_of_the_ci(tmp_path):
    listing = [
        _node("old-ci", 7, CI_LABEL),
        _node("fresh-ci", 1, CI_LABEL),
        _node("old-other", 30, {"purpose": "someone-else"}),
        _node("old-unlabelled", 30, None),
    ]
    proc = _reap(tmp_path, listing)
    assert proc.returncode == 0, proc.stderr
    calls = _calls(tmp_path)
    deletes = [c for c in calls if "tpu-vm delete" in c]
    # the same listing comes back for both zones: old-ci once per zone, nothing else; each delete waits for its end
    assert deletes == [
        "compute tpus tpu-vm delete old-ci --zone=us-west4-a --quiet",
        "compute tpus tpu-vm delete old-ci --zone=us-central1-a --quiet",
    ]
    assert sum("tpu-vm list" in c for c in calls) == 2  # ZONE is not listed twice


@pytest.mark.parametrize("failure", ["FAKE_DELETE_FAIL", "FAKE_LIST_FAIL"])
def test_reaper_failures_fail_the_job_loudly(tmp_path, failure):
    proc = _reap(tmp_path, [_node("old-ci", 7, CI_LABEL)], **{failure: "1"})
    assert proc.returncode == 1
    assert "::error" in proc.stderr and ("could not delete old-ci" in proc.stderr or "could not list" in proc.stderr)
    # it still tried every zone
    assert sum("tpu-vm list" in c for c in _calls(tmp_path)) == 2


def test_reaper_says_why_it_keeps_a_ci_vm_of_unknown_age(tmp_path):
    node = _node("no-time", 7, CI_LABEL)
    del node["createTime"]
    proc = _reap(tmp_path, [node])
    assert proc.returncode == 0 and "no-time has no createTime" in proc.stderr
    assert not [c for c in _calls(tmp_path) if "delete" in c]


def test_ci_workflow_runs_the_readme_test_command_on_every_push():
    wf = _load(CI_WORKFLOW)
    assert "push" in wf["on"] and not (wf["on"]["push"] or {}).get("branches")
    assert any(s.get("run", "").strip() == "make test" for _, s in _steps(wf))


# --------------------------------------------------------------------------------------------- scripts
def test_tpu_vm_script_is_valid_bash_and_installs_the_readme_way():
    script = REPO / "scripts" / "tpu_vm_test.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    for needle in ("make venv", "make install", "export PJRT_DEVICE=TPU", '-m "xla or tpu"', "--junitxml="):
        assert needle in text, needle


def test_the_ddp_replica_test_is_selected_by_the_tpu_run():
    """The TPU script selects `-m "xla or tpu"`: the DDP replica test must carry the `tpu` mark. Its decorators are
    read from the module's source (a test module is never imported by another) and applied to a stand-in."""
    from forkq.fixedby import fixed_by
    from helpers.runif import RunIf

    path = REPO / "tests" / "tests_pytorch" / "tpu" / "test_xla_ddp_sync.py"
    test = next(node for node in ast.parse(path.read_text()).body
                if isinstance(node, ast.FunctionDef) and node.name == "test_replicas_stay_in_sync_and_match_one_device")
    def stand_in():
        pass

    for decorator in reversed(test.decorator_list):
        # only the decorators a test of this kind carries: RunIf(...) and pytest.mark.<name>
        stand_in = eval(compile(ast.Expression(decorator), str(path), "eval"), {"RunIf": RunIf, "pytest": pytest})(
            stand_in)
    marks = {m.name for m in stand_in.pytestmark}
    assert "tpu" in marks, marks
    assert fixed_by(path) == "0005-tpu-reduce-gradients-inside-the-closure.patch"


def test_the_tpu_doc_states_what_the_repository_owner_must_set_up():
    doc = (REPO / "docs" / "tpu-vm.md").read_text()
    wf = _load(TPU_WORKFLOW)
    text = TPU_WORKFLOW.read_text()
    # every secret and variable the workflow reads, and both environments, are explained there
    for name in sorted(set(re.findall(r"\$\{\{\s*(?:secrets|vars)\.([A-Z0-9_]+)", text))):
        assert f"`{name}`" in doc, name
    environments = {job["environment"] for job in wf["jobs"].values() if "environment" in job}
    assert environments == {"tpu", "tpu-reaper"}
    for env in environments:
        assert f"| `{env}` |" in doc, env
    tpu_row = next(line for line in doc.splitlines() if line.startswith("| `tpu` |"))
    assert "Required reviewers" in tpu_row
    # the Workload Identity attribute condition, pinned to this repository and its environments
    condition = re.search(r"```\n(assertion\..*?)```", doc, flags=re.S)
    assert condition, "no attribute condition block"
    cond = condition.group(1)
    assert "assertion.repository_id ==" in cond and "assertion.repository ==" in cond
    assert all(f"'{env}'" in cond for env in environments)
