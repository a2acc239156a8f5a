"""The Kubernetes examples (``examples/kubernetes/*.yaml``): valid objects, wired to the launcher.

Three layers, all offline and without a cluster:

1. Schemas. Every document is validated: core objects (ConfigMap) against the Kubernetes JSON
   Schemas bundled in the ``kubernetes-validate`` package (strict variant: unknown fields are
   errors, as with ``kubectl``'s default field validation); the Volcano ``Job`` against a cut of
   Volcano's own CRD schema (``tests/data/k8s/volcano-job-v1alpha1.schema.yaml``, source in its
   header), its ``metadata`` as an ObjectMeta and every ``spec.tasks[*].template`` as a Kubernetes
   ``PodTemplateSpec``. Both the oldest and the newest Kubernetes version the package bundles are
   checked. Negative tests prove that each validator rejects a typo.
2. The launcher command lines (container ``command`` + ``args``, preStop ``exec.command``) are
   parsed by the real click commands without running them: a misspelt or removed option fails here.
3. The wiring the schemas cannot see: ConfigMap names and mount paths against the launcher's
   defaults, terminationGracePeriodSeconds against ``--termination-grace-period``, one run dir for
   ``run`` and ``prestop``, the downward-API variables, the TaskD port, ``/dev/shm``.
"""

import copy
import functools
import importlib.resources
import json
import os
import posixpath
import re
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

import click
import jsonschema
import pytest
import yaml
from referencing import Registry, Resource

from launcher.commands.cli import cli
from launcher.commands.run import run_options
from launcher.jobspec.options import DEFAULT_RANK_TABLE

try:  # the test extra installs it; without it only the schema tests are skipped
    import kubernetes_validate.utils as kv_utils
except ImportError:  # pragma: no cover - depends on the environment
    kv_utils = None

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "kubernetes"
MANIFESTS = sorted(EXAMPLES.glob("*.yaml"))
VOLCANO_JOB_SCHEMA = ROOT / "tests" / "data" / "k8s" / "volcano-job-v1alpha1.schema.yaml"

VOLCANO_API = "batch.volcano.sh/v1alpha1"
#: Volcano's default grace-over-time: the upper bound of a graceful pod deletion.
VOLCANO_GRACE_OVER_TIME = 900
TASKD_PORT = 9601
K8S_DEFS_ID = "https://kubernetes.io/api/_definitions.json"
OBJECT_META = {"$ref": K8S_DEFS_ID + "#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}
#: The ConfigMaps the MindX components address by name: prefix -> (file the launcher reads, option).
CONFIG_MAPS = {
    "rings-config": "rank_table",
    "fault-config": "fault_npus",
    "reset-config": "reset_json",
}

needs_k8s_schemas = pytest.mark.skipif(
    kv_utils is None, reason="kubernetes-validate is not installed (pip install -e '.[test]')")


# --- loading ------------------------------------------------------------------------------------

def load_documents(path: Path) -> List[Dict[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        return [doc for doc in yaml.safe_load_all(fh) if doc is not None]


@functools.lru_cache(maxsize=None)
def documents(name: str) -> Tuple[Dict[str, Any], ...]:
    return tuple(load_documents(EXAMPLES / name))


def manifest_names() -> List[str]:
    return [p.name for p in MANIFESTS]


def the_job(name: str) -> Dict[str, Any]:
    jobs = [d for d in documents(name) if d.get("apiVersion") == VOLCANO_API and d.get("kind") == "Job"]
    assert len(jobs) == 1, f"{name}: expected exactly one Volcano Job, found {len(jobs)}"
    return jobs[0]


def config_maps(name: str) -> Dict[str, Dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in documents(name) if d.get("kind") == "ConfigMap"}


def pod_templates(job: Mapping[str, Any]) -> Iterator[Tuple[str, Dict[str, Any]]]:
    for i, task in enumerate(job["spec"]["tasks"]):
        yield f"spec.tasks[{i}]({task.get('name', '?')}).template", task["template"]


def containers(name: str) -> Iterator[Tuple[str, Dict[str, Any], Dict[str, Any]]]:
    """(label, pod spec, container) for every container of every task of the manifest's Job."""
    for where, template in pod_templates(the_job(name)):
        for container in template["spec"]["containers"]:
            yield f"{name} {where} container {container['name']}", template["spec"], container


# --- schemas ------------------------------------------------------------------------------------

def k8s_versions() -> List[str]:
    if kv_utils is None:
        return ["none"]
    versions = sorted(set(kv_utils.all_versions()), key=lambda v: tuple(int(x) for x in v.split(".")))
    return sorted({versions[0], versions[-1]}, key=versions.index)


@functools.lru_cache(maxsize=None)
def k8s_schema_dir(version: str):
    return importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema" / f"v{version}-local-strict"


@functools.lru_cache(maxsize=None)
def k8s_registry(version: str) -> Registry:
    defs = json.loads((k8s_schema_dir(version) / "_definitions.json").read_text(encoding="utf-8"))
    assert defs["$id"] == K8S_DEFS_ID
    return Registry().with_resource(K8S_DEFS_ID, Resource.from_contents(defs))


@functools.lru_cache(maxsize=None)
def k8s_validator(version: str, type_file: str) -> jsonschema.Draft202012Validator:
    """Validator for one Kubernetes type, e.g. ``configmap-v1.json`` or ``podtemplatespec-v1.json``."""
    path = k8s_schema_dir(version) / type_file
    schema = OBJECT_META if type_file == "objectmeta" else json.loads(path.read_text(encoding="utf-8"))
    return jsonschema.Draft202012Validator(schema, registry=k8s_registry(version))


def k8s_type_file(doc: Mapping[str, Any]) -> str:
    """The bundled schema file of a Kubernetes object, as kubernetes-validate names it."""
    api = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", doc["apiVersion"])  # apps/v1 -> apps-v1
    return f"{doc['kind'].lower()}-{api}.json"


@functools.lru_cache(maxsize=None)
def volcano_job_validator() -> jsonschema.Draft202012Validator:
    with open(VOLCANO_JOB_SCHEMA, encoding="utf-8") as fh:
        schema = yaml.safe_load(fh)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def errors_of(validator: jsonschema.Draft202012Validator, instance: Any, label: str) -> List[str]:
    found = []
    for error in sorted(validator.iter_errors(instance), key=lambda e: list(map(str, e.absolute_path))):
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
        found.append(f"{label}{path}: {error.message[:300]}")
    return found


def schema_errors(doc: Mapping[str, Any], version: str, label: str) -> List[str]:
    """Every schema problem of one manifest document."""
    if doc.get("apiVersion") == VOLCANO_API and doc.get("kind") == "Job":
        problems = errors_of(volcano_job_validator(), doc, label)
        problems += errors_of(k8s_validator(version, "objectmeta"), doc.get("metadata"), label + ".metadata")
        if not problems:  # the templates exist where the Job schema says they do
            for where, template in pod_templates(doc):
                problems += errors_of(k8s_validator(version, "podtemplatespec-v1.json"), template,
                                      f"{label}.{where}")
        return problems
    type_file = k8s_type_file(doc)
    if not (k8s_schema_dir(version) / type_file).is_file():
        return [f"{label}: no schema for {doc.get('apiVersion')} {doc.get('kind')}; add one to this test"]
    return errors_of(k8s_validator(version, type_file), doc, label)


# --- the launcher's command line ----------------------------------------------------------------

def expand(arg: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion in command/args (``$$`` escapes; undefined stays as is)."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), arg)


def container_env(container: Mapping[str, Any]) -> Dict[str, str]:
    """The container's variables as the process would see them (downward API values made up)."""
    env = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = expand(str(var["value"]), env)
        else:
            env[var["name"]] = f"<{var['name'].lower()}>"
    return env


def parse_launcher(argv: List[str], monkeypatch: pytest.MonkeyPatch,
                   env: Mapping[str, str]) -> click.Context:
    """Parse ``launcher <command> ...`` with the real click commands, executing nothing.

    The process environment is replaced by the container's LAUNCHER_* variables, since click reads
    ``LAUNCHER_<OPTION>`` for every option that is not on the command line.
    """
    assert argv and argv[0] == "launcher", f"not a launcher command line: {argv}"
    assert len(argv) > 1 and not argv[1].startswith("-"), f"no subcommand in {argv}"
    for name in list(os.environ):
        if name.startswith("LAUNCHER_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        if name.startswith("LAUNCHER_"):
            monkeypatch.setenv(name, value)
    group_ctx = click.Context(cli, info_name="launcher")
    command = cli.get_command(group_ctx, argv[1])
    assert command is not None, f"`launcher {argv[1]}` does not exist"
    return command.make_context(argv[1], list(argv[2:]), parent=group_ctx)


def main_argv(container: Mapping[str, Any]) -> List[str]:
    env = container_env(container)
    return [expand(a, env) for a in list(container.get("command", [])) + list(container.get("args", []))]


def prestop_argv(container: Mapping[str, Any]) -> List[str]:
    return list(container["lifecycle"]["preStop"]["exec"]["command"])


def launcher_env_vars() -> Dict[str, str]:
    """Every ``LAUNCHER_*`` variable an option of ``run`` or ``prestop`` reads -> the command."""
    ctx = click.Context(cli, info_name="launcher")
    known = {}
    for name in ("run", "prestop"):
        for param in cli.get_command(ctx, name).params:
            for var in [param.envvar] if isinstance(param.envvar, str) else (param.envvar or []):
                known[var] = name
    return known


def mount_for(container: Mapping[str, Any], path: str) -> Optional[Dict[str, Any]]:
    """The volumeMount whose mountPath holds ``path`` (the longest match)."""
    best = None
    for mount in container.get("volumeMounts", []):
        root = mount["mountPath"].rstrip("/") or "/"
        if path == root or path.startswith(root + "/"):
            if best is None or len(root) > len(best["mountPath"].rstrip("/")):
                best = mount
    return best


def volume(pod_spec: Mapping[str, Any], name: str) -> Dict[str, Any]:
    found = [v for v in pod_spec.get("volumes", []) if v["name"] == name]
    assert len(found) == 1, f"volume {name!r} declared {len(found)} times"
    return found[0]


# --- tests: the files ---------------------------------------------------------------------------

def test_both_examples_exist():
    assert {"pytorch-job.yaml", "mindspore-job.yaml"} <= set(manifest_names())


@pytest.mark.parametrize("name", manifest_names())
def test_manifest_is_configmaps_then_one_volcano_job(name):
    docs = documents(name)
    kinds = [(d.get("apiVersion"), d.get("kind")) for d in docs]
    assert kinds == [("v1", "ConfigMap")] * 3 + [(VOLCANO_API, "Job")], kinds
    namespaces = {d["metadata"].get("namespace") for d in docs}
    assert len(namespaces) == 1, f"ConfigMaps and Job must share one namespace, got {namespaces}"


# --- tests: schemas -----------------------------------------------------------------------------

@needs_k8s_schemas
@pytest.mark.parametrize("version", k8s_versions())
@pytest.mark.parametrize("name", manifest_names())
def test_every_document_is_schema_valid(name, version):
    problems = []
    for i, doc in enumerate(documents(name)):
        problems += schema_errors(doc, version, f"{name}[{i}] {doc.get('kind')} {doc['metadata']['name']}")
    assert not problems, "\n".join(problems)


def _set(obj: Any, path: str, value: Any) -> None:
    *parents, last = path.split("/")
    for key in parents:
        obj = obj[int(key)] if isinstance(obj, list) else obj[key]
    if isinstance(obj, list):
        obj[int(last)] = value
    else:
        obj[last] = value


def _rename(obj: Any, path: str, new_key: str) -> None:
    *parents, last = path.split("/")
    for key in parents:
        obj = obj[int(key)] if isinstance(obj, list) else obj[key]
    obj[new_key] = obj.pop(last)


TEMPLATE = "spec/tasks/0/template"
CONTAINER = TEMPLATE + "/spec/containers/0"
BROKEN = {
    # (document index, mutation, what the validator must say)
    "misspelt pod field": (3, lambda d: _rename(d, TEMPLATE + "/spec/terminationGracePeriodSeconds",
                                                "terminationGracePeriodSecond"), "terminationGracePeriodSecond"),
    "grace period as string": (3, lambda d: _set(d, TEMPLATE + "/spec/terminationGracePeriodSeconds", "600"),
                               "600"),
    "fieldRef without fieldPath": (3, lambda d: _set(d, CONTAINER + "/env/0/valueFrom/fieldRef", {}),
                                   "fieldPath"),
    "port name too long": (3, lambda d: _set(d, CONTAINER + "/ports/0/name", "taskd-port-of-rank0"), None),
    "misspelt Volcano field": (3, lambda d: _rename(d, "spec/maxRetry", "maxRetries"), "maxRetries"),
    "maxRetry as string": (3, lambda d: _set(d, "spec/maxRetry", "3"), "'3'"),
    "unknown task field": (3, lambda d: _set(d, "spec/tasks/0/replica", 2), "replica"),
    "label value not a string": (0, lambda d: _set(d, "metadata/labels/ring-controller.atlas", True), "True"),
    "ConfigMap data not a string": (1, lambda d: _set(d, "data/fault-npus", {"status": "initializing"}),
                                    "fault-npus"),
}


@needs_k8s_schemas
@pytest.mark.parametrize("case", sorted(BROKEN))
def test_validators_reject_broken_documents(case):
    index, mutate, needle = BROKEN[case]
    doc = copy.deepcopy(documents("pytorch-job.yaml")[index])
    mutate(doc)
    version = k8s_versions()[-1]
    problems = schema_errors(doc, version, case)
    if case == "port name too long":  # IANA_SVC_NAME (<= 15 chars) is checked by the API server,
        assert not problems  # not by the OpenAPI schema: documents what the schemas cannot catch
        return
    assert problems, f"{case}: accepted"
    assert any(needle in p for p in problems), "\n".join(problems)


# --- tests: launcher command lines --------------------------------------------------------------

@pytest.mark.parametrize("name", manifest_names())
def test_container_command_is_launcher_run_and_parses(name, monkeypatch):
    for label, _pod, container in containers(name):
        argv = main_argv(container)
        assert argv[:2] == ["launcher", "run"], f"{label}: the launcher must be PID 1, got {argv[:3]}"
        ctx = parse_launcher(argv, monkeypatch, container_env(container))
        training = tuple(argv[argv.index("--") + 1:])
        assert ctx.params["command"] == training, f"{label}: options must all come before `--`"
        assert training[0] == "python"
        assert ctx.params["framework"] == name.split("-")[0]


@pytest.mark.parametrize("name", manifest_names())
def test_recover_strategy_values_are_known(name, monkeypatch):
    """click takes --recover-strategy as free text; the launcher checks the names when it runs."""
    from launcher.jobspec.recovery import parse_strategies

    for label, _pod, container in containers(name):
        strategy = parse_launcher(main_argv(container), monkeypatch, container_env(container)).params.get(
            "recover_strategy")
        if strategy:
            assert parse_strategies(strategy, f"{label} --recover-strategy")


@pytest.mark.parametrize("name", manifest_names())
def test_prestop_is_launcher_prestop_and_parses(name, monkeypatch):
    for label, _pod, container in containers(name):
        argv = prestop_argv(container)
        assert argv[:2] == ["launcher", "prestop"], f"{label}: preStop must be `launcher prestop`"
        parse_launcher(argv, monkeypatch, container_env(container))


def test_a_misspelt_option_is_caught(monkeypatch):
    """The parse above is meaningful: click rejects what `launcher run` does not know."""
    _label, _pod, container = next(containers("pytorch-job.yaml"))
    argv = main_argv(container)
    argv[argv.index("--termination-grace-period")] = "--termination-grace-periods"
    with pytest.raises(click.UsageError, match="--termination-grace-periods"):
        parse_launcher(argv, monkeypatch, container_env(container))
    with pytest.raises(click.UsageError):
        parse_launcher(["launcher", "prestop", "--no-such-option"], monkeypatch, {})
    from launcher.common.errors import UsageError
    from launcher.jobspec.recovery import parse_strategies

    with pytest.raises(UsageError):
        parse_strategies("dump,exti", "--recover-strategy")


@pytest.mark.parametrize("name", manifest_names())
def test_grace_period_matches_the_launcher(name, monkeypatch):
    for label, pod, container in containers(name):
        ctx = parse_launcher(main_argv(container), monkeypatch, container_env(container))
        grace = pod["terminationGracePeriodSeconds"]
        assert ctx.params["termination_grace_period"] == grace, \
            f"{label}: --termination-grace-period must equal terminationGracePeriodSeconds ({grace})"
        gasp = run_options(ctx).resolved_gasp_timeout()
        assert 0 < gasp < grace, f"{label}: gasp timeout {gasp} s does not fit in {grace} s"
        assert grace < VOLCANO_GRACE_OVER_TIME, f"{label}: must stay below Volcano's grace-over-time"


@pytest.mark.parametrize("name", manifest_names())
def test_run_and_prestop_share_a_private_run_dir(name, monkeypatch):
    for label, pod, container in containers(name):
        env = container_env(container)
        run_dir = parse_launcher(main_argv(container), monkeypatch, env).params["run_dir"]
        prestop_dir = parse_launcher(prestop_argv(container), monkeypatch, env).params["run_dir"]
        assert run_dir and run_dir == prestop_dir, f"{label}: run {run_dir!r} vs prestop {prestop_dir!r}"
        mount = mount_for(container, run_dir)
        assert mount is not None, f"{label}: run dir {run_dir} is on no volume"
        assert "emptyDir" in volume(pod, mount["name"]), \
            f"{label}: the run dir must be private to the pod (an emptyDir), not shared storage"


@pytest.mark.parametrize("name", manifest_names())
def test_launcher_variables_are_ones_the_launcher_reads(name):
    known = launcher_env_vars()
    for label, _pod, container in containers(name):
        for var in container.get("env", []):
            if var["name"].startswith("LAUNCHER_"):
                assert var["name"] in known, f"{label}: {var['name']} is read by no launcher option"


@pytest.mark.parametrize("name", manifest_names())
def test_variable_references_are_defined(name):
    for label, _pod, container in containers(name):
        defined = {v["name"] for v in container.get("env", [])}
        texts = list(container.get("command", [])) + list(container.get("args", []))
        texts += [str(v.get("value", "")) for v in container.get("env", [])]
        for text in texts:
            for ref in re.findall(r"(?<!\$)\$\(([A-Za-z_][A-Za-z0-9_]*)\)", text):
                assert ref in defined, f"{label}: $({ref}) is not a variable of the container"


@pytest.mark.parametrize("name", manifest_names())
def test_launcher_output_goes_to_writable_shared_storage(name, monkeypatch):
    for label, pod, container in containers(name):
        params = parse_launcher(main_argv(container), monkeypatch, container_env(container)).params
        for option in ("log_dir", "checkpoint_dir", "group_info_root"):
            path = params.get(option)
            if not path:
                continue
            mount = mount_for(container, path)
            assert mount is not None, f"{label}: --{option} {path} is on no volume"
            assert not mount.get("readOnly"), f"{label}: --{option} {path} is read-only"
            assert "emptyDir" not in volume(pod, mount["name"]), \
                f"{label}: --{option} {path} would vanish with the pod"


# --- tests: wiring to MindX ---------------------------------------------------------------------

@pytest.mark.parametrize("name", manifest_names())
def test_config_maps_are_named_after_the_job_and_start_initializing(name):
    job = the_job(name)
    maps = config_maps(name)
    for prefix in CONFIG_MAPS:
        cm_name = f"{prefix}-{job['metadata']['name']}"
        assert cm_name in maps, f"{name}: no ConfigMap {cm_name}"
        (payload,) = maps[cm_name]["data"].values()
        assert json.loads(payload) == {"status": "initializing"}
    rings = maps[f"rings-config-{job['metadata']['name']}"]
    assert rings["metadata"]["labels"]["ring-controller.atlas"].startswith("ascend-")


@pytest.mark.parametrize("name", manifest_names())
def test_config_maps_are_mounted_where_the_launcher_reads(name, monkeypatch):
    job = the_job(name)
    maps = config_maps(name)
    for label, pod, container in containers(name):
        params = parse_launcher(main_argv(container), monkeypatch, container_env(container)).params
        for prefix, option in CONFIG_MAPS.items():
            path = params.get(option) or (DEFAULT_RANK_TABLE if option == "rank_table" else None)
            assert path, f"{label}: no path for {option}"
            mount = mount_for(container, path)
            assert mount is not None, f"{label}: {path} is on no volume"
            assert mount["mountPath"].rstrip("/") == posixpath.dirname(path), \
                f"{label}: mount the ConfigMap directory at {posixpath.dirname(path)}"
            assert "subPath" not in mount and "subPathExpr" not in mount, \
                f"{label}: a subPath mount never sees the operator's updates of {path}"
            source = volume(pod, mount["name"]).get("configMap")
            cm_name = f"{prefix}-{job['metadata']['name']}"
            assert source and source["name"] == cm_name, f"{label}: {path} must come from ConfigMap {cm_name}"
            assert posixpath.basename(path) in maps[cm_name]["data"], f"{label}: {cm_name} has no key for {path}"


@pytest.mark.parametrize("name", manifest_names())
def test_rank_table_volume_is_the_one_hccl_controller_looks_for(name):
    for label, pod, container in containers(name):
        mount = mount_for(container, DEFAULT_RANK_TABLE)
        assert mount and mount["name"] == "ascend-910-config", \
            f"{label}: HCCL-Controller associates the job with its rings-config through this volume name"


@pytest.mark.parametrize("name", manifest_names())
def test_mindx_labels(name):
    job = the_job(name)
    labels = job["metadata"]["labels"]
    assert labels["ring-controller.atlas"].startswith("ascend-")
    assert labels["fault-scheduling"] == "grace", "the dying gasp needs graceful pod deletion"
    assert job["spec"]["maxRetry"] > 0
    assert job["spec"]["schedulerName"] == "volcano"
    for where, template in pod_templates(job):
        assert template["metadata"]["labels"]["ring-controller.atlas"] == labels["ring-controller.atlas"], where
    assert job["spec"]["minAvailable"] == sum(t["replicas"] for t in job["spec"]["tasks"]), \
        "gang scheduling: every pod of the job or none"


@pytest.mark.parametrize("name", manifest_names())
def test_pod_essentials(name):
    for label, pod, container in containers(name):
        env = {v["name"]: v for v in container.get("env", [])}
        assert env["XDL_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP", label
        assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP", label
        assert "MINDX_TASK_ID" in env, label
        assert env["framework"]["value"].lower() == name.split("-")[0], label
        ports = [(p["containerPort"], p.get("name")) for p in container.get("ports", [])]
        assert (TASKD_PORT, "taskd-port") in ports, f"{label}: every pod declares the TaskD port"
        shm = mount_for(container, "/dev/shm")
        assert shm and shm["mountPath"] == "/dev/shm", f"{label}: no /dev/shm mount"
        assert volume(pod, shm["name"])["emptyDir"]["medium"] == "Memory", label
        requests = container["resources"]["requests"]
        limits = container["resources"]["limits"]
        assert requests["huawei.com/Ascend910"] == limits["huawei.com/Ascend910"] > 0, label
        declared = {v["name"] for v in pod.get("volumes", [])}
        for mount in container.get("volumeMounts", []):
            assert mount["name"] in declared, f"{label}: mount {mount['name']} has no volume"


def test_dockerfile_uses_exec_form():
    """A shell-form ENTRYPOINT/CMD makes /bin/sh PID 1, which does not forward SIGTERM (defect 5)."""
    dockerfile = (EXAMPLES / "Dockerfile").read_text(encoding="utf-8")
    instructions = [line.strip() for line in dockerfile.splitlines()
                    if re.match(r"\s*(ENTRYPOINT|CMD)\s", line)]
    assert any(i.startswith("ENTRYPOINT") for i in instructions)
    for instruction in instructions:
        form = instruction.split(None, 1)[1]
        assert json.loads(form) and form.startswith("["), f"not exec form: {instruction}"


# --- tests: exit codes for the scheduler (docs/failures.md) ---------------------------------------

FAILURES_DOC = ROOT / "docs" / "failures.md"
#: Events a failed pod raises, which would win over a later exitCode rule (Volcano: first match wins).
FAILED_POD_EVENTS = {"PodFailed", "*"}


def launcher_exit_codes() -> Dict[str, int]:
    """The launcher's default exit codes the scheduler acts on."""
    ctx = click.Context(cli, info_name="launcher")
    params = {p.name: p.default for p in cli.get_command(ctx, "run").params}
    return {"no_progress": params["no_progress_exit_code"], "node_fault": params["node_fault_exit_code"]}


def volcano_admission_problems(policies: List[Mapping[str, Any]], label: str) -> List[str]:
    """Volcano's admission rules for a policy list (its webhook's validatePolicies): event(s) or
    exitCode, never both, never neither; no exit code 0; no event or exit code twice."""
    problems, events, codes = [], set(), set()
    for i, policy in enumerate(policies):
        named = ([policy["event"]] if policy.get("event") else []) + list(policy.get("events", []))
        code = policy.get("exitCode")
        if named and code is not None:
            problems.append(f"{label}[{i}]: must not specify event and exitCode simultaneously")
        elif not named and code is None:
            problems.append(f"{label}[{i}]: either event or exitCode should be specified")
        elif code == 0:
            problems.append(f"{label}[{i}]: 0 is not a valid error code")
        if (code is not None and code in codes) or events & set(named):
            problems.append(f"{label}[{i}]: duplicate event or exit code")
        codes.add(code)
        events |= set(named)
    return problems


def exit_code_rules_problems(job_spec: Mapping[str, Any], codes: Mapping[str, int], label: str) -> List[str]:
    """The launcher's exit codes have their rules (AbortJob for no progress), before any rule a failed
    pod matches by its event, and no task overrides them with its own PodFailed rule."""
    policies = job_spec.get("policies", [])
    problems = volcano_admission_problems(policies, f"{label}.policies")
    first_event = next((i for i, p in enumerate(policies)
                        if FAILED_POD_EVENTS & ({p.get("event")} | set(p.get("events", [])))), len(policies))
    by_code = {p.get("exitCode"): (i, p.get("action")) for i, p in enumerate(policies) if p.get("exitCode")}
    for what, code in codes.items():
        if code not in by_code:
            problems.append(f"{label}: no policy for the launcher's {what} exit code {code}")
        elif by_code[code][0] > first_event:
            problems.append(f"{label}: the exitCode {code} policy comes after a PodFailed rule, which wins")
    if by_code.get(codes["no_progress"], (0, "AbortJob"))[1] != "AbortJob":
        problems.append(f"{label}: exit code {codes['no_progress']} (cannot progress) must abort the job")
    for i, task in enumerate(job_spec.get("tasks", [])):
        task_policies = task.get("policies", [])
        problems += volcano_admission_problems(task_policies, f"{label}.tasks[{i}].policies")
        if any(FAILED_POD_EVENTS & ({p.get("event")} | set(p.get("events", []))) for p in task_policies):
            problems.append(f"{label}.tasks[{i}]: a task-level PodFailed rule overrides the job's exit codes")
    return problems


@pytest.mark.parametrize("name", manifest_names())
def test_volcano_policies_stop_requeueing_on_the_launchers_exit_codes(name):
    assert exit_code_rules_problems(the_job(name)["spec"], launcher_exit_codes(), name) == []


def test_exit_code_rules_catch_the_mistakes():
    codes = launcher_exit_codes()
    good = {"policies": [{"exitCode": 93, "action": "AbortJob"}, {"exitCode": 94, "action": "RestartJob"},
                         {"event": "PodFailed", "action": "RestartJob"}], "tasks": [{"name": "w"}]}
    assert exit_code_rules_problems(good, codes, "job") == []
    late = copy.deepcopy(good)
    late["policies"].append(late["policies"].pop(0))
    both = copy.deepcopy(good)
    both["policies"][0]["event"] = "PodFailed"
    task = copy.deepcopy(good)
    task["tasks"][0]["policies"] = [{"event": "PodFailed", "action": "RestartJob"}]
    restart = copy.deepcopy(good)
    restart["policies"][0]["action"] = "RestartJob"
    zero = copy.deepcopy(good)
    zero["policies"].insert(0, {"exitCode": 0, "action": "AbortJob"})
    for broken, words in [(late, "comes after a PodFailed rule"), (both, "simultaneously"),
                          (task, "task-level PodFailed"), (restart, "must abort"), (zero, "0 is not a valid")]:
        assert any(words in p for p in exit_code_rules_problems(broken, codes, "job")), words


def doc_yaml_blocks() -> List[Dict[str, Any]]:
    text = FAILURES_DOC.read_text(encoding="utf-8")
    return [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", text, re.S)]


def test_failure_docs_volcano_policies_are_valid_and_complete():
    [snippet] = [b for b in doc_yaml_blocks() if "apiVersion" not in b]
    job = {"apiVersion": VOLCANO_API, "kind": "Job", "metadata": {"name": "doc"},
           "spec": {**snippet["spec"], "tasks": [{"name": "worker", "replicas": 1, "template": {}}]}}
    assert errors_of(volcano_job_validator(), job, "docs/failures.md") == []
    assert exit_code_rules_problems(job["spec"], launcher_exit_codes(), "docs/failures.md") == []


def pod_failure_policy_versions() -> List[str]:
    """Bundled Kubernetes versions for podFailurePolicy: from 1.30, the oldest and the newest. (It is on
    by default from 1.26, but the OpenAPI of 1.26-1.29 lists ``onPodConditions`` as required in every
    rule, while Kubernetes' own examples of those versions use ``onExitCodes`` alone.)"""
    if kv_utils is None:
        return ["none"]
    versions = sorted(set(kv_utils.all_versions()), key=lambda v: tuple(int(x) for x in v.split(".")))
    usable = [v for v in versions if tuple(int(x) for x in v.split("."))[:2] >= (1, 30)]
    return sorted({usable[0], usable[-1]}, key=usable.index)


@needs_k8s_schemas
@pytest.mark.parametrize("version", pod_failure_policy_versions())
def test_failure_docs_pod_failure_policy_is_a_valid_job(version, monkeypatch):
    [job] = [b for b in doc_yaml_blocks() if b.get("kind") == "Job" and b.get("apiVersion") == "batch/v1"]
    assert schema_errors(job, version, "docs/failures.md Job") == []
    broken = copy.deepcopy(job)
    broken["spec"]["podFailurePolicy"]["rules"][0]["onExitCode"] = broken["spec"]["podFailurePolicy"]["rules"][0].pop(
        "onExitCodes")
    assert schema_errors(broken, version, "broken") != []  # the schema sees a misspelt field
    codes = launcher_exit_codes()
    rules = job["spec"]["podFailurePolicy"]["rules"]
    by_code = {v: r["action"] for r in rules for v in r.get("onExitCodes", {}).get("values", [])}
    assert by_code == {codes["no_progress"]: "FailJob", codes["node_fault"]: "Count"}
    spec = job["spec"]["template"]["spec"]
    assert spec["restartPolicy"] == "Never"  # podFailurePolicy requires it
    [container] = spec["containers"]
    assert all(r["onExitCodes"]["containerName"] == container["name"] for r in rules if "onExitCodes" in r)
    parse_launcher(main_argv(container), monkeypatch, {})  # the launcher command line parses
