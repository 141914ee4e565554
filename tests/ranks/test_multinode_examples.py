"""The multi-node examples (examples/multinode, docs/multinode.md) hold together: the Kubernetes manifest is
valid against the Kubernetes API's own schemas (kubernetes-validate, strict: no unknown field), the shell
scripts parse (bash -n), what the manifest and the Slurm script hand node.sh is what node.sh reads, and
node.sh names what is missing. tests/ranks/test_multinode.py runs node.sh on two emulated Slurm nodes."""

from __future__ import annotations

import re
import subprocess

import kubernetes_validate
import yaml

from pipebd_core.spec import parse_spec
from tests.helpers import ROOT

EXAMPLES = ROOT / "examples" / "multinode"
KUBERNETES_VERSION = "1.31.0"  # a release every maintained cluster serves these kinds at


def node_script_reads() -> set[str]:
    """The environment variables examples/multinode/node.sh reads."""
    return set(re.findall(r"\$\{([A-Z_]+)", (EXAMPLES / "node.sh").read_text()))


def test_the_kubernetes_manifest_is_valid_and_hands_node_sh_what_it_reads() -> None:
    documents = list(yaml.safe_load_all((EXAMPLES / "kubernetes.yaml").read_text()))
    assert [document["kind"] for document in documents] == ["PersistentVolumeClaim", "Service", "Job"]
    for document in documents:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)  # raises on any problem
    job = documents[2]["spec"]
    container = job["template"]["spec"]["containers"][0]
    assert job["completionMode"] == "Indexed" and job["completions"] == job["parallelism"]
    assert container["command"] == ["bash", "examples/multinode/node.sh"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert set(env) | {"JOB_COMPLETION_INDEX"} <= node_script_reads()
    assert (
        int(env["NNODES"])
        == job["completions"]
        == parse_spec(yaml.safe_load((ROOT / env["SPEC"]).read_text())).schedule.nodes
    )
    service, pods = documents[1], job["template"]["spec"]
    assert (
        env["HEAD"]
        == f"{documents[2]['metadata']['name']}-0.{service['metadata']['name']}"
        == f"{pods['subdomain']}-0.{pods['subdomain']}"
    )
    mounted = container["volumeMounts"][0]["mountPath"]
    assert (
        env["OUT"].startswith(mounted + "/")
        and pods["volumes"][0]["persistentVolumeClaim"]["claimName"] == documents[0]["metadata"]["name"]
    )
    assert documents[0]["spec"]["accessModes"] == ["ReadWriteMany"]  # one run directory seen by every node


def test_the_scripts_parse_and_the_slurm_job_runs_node_sh_once_per_node() -> None:
    for script in ("node.sh", "slurm.sbatch"):
        subprocess.run(["bash", "-n", str(EXAMPLES / script)], check=True)
    sbatch = (EXAMPLES / "slurm.sbatch").read_text()
    options = dict(re.findall(r"^#SBATCH --([a-z-]+)=(\S+)$", sbatch, flags=re.MULTILINE))
    assert options["ntasks-per-node"] == "1" and "srun --kill-on-bad-exit=1 bash examples/multinode/node.sh" in sbatch
    spec = parse_spec(yaml.safe_load((EXAMPLES / "two-nodes.yaml").read_text()))
    assert int(options["nodes"]) == spec.schedule.nodes and "SPEC:-examples/multinode/two-nodes.yaml" in sbatch
    assert {"HEAD", "OUT", "SPEC"} <= set(re.findall(r"^export ([A-Z_]+)", sbatch, flags=re.MULTILINE)) | {"HEAD"}
    assert {"SLURM_NODEID", "SLURM_NNODES", "SLURM_JOB_ID"} <= node_script_reads()


def test_node_sh_names_what_is_missing_before_starting_anything() -> None:
    script = str(EXAMPLES / "node.sh")
    bare = subprocess.run(["bash", script], env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    assert bare.returncode != 0 and "set NODE_RANK" in bare.stderr
    node0 = {"PATH": "/usr/bin:/bin", "NODE_RANK": "0", "NNODES": "2", "RUN_ID": "r", "HEAD": "h", "OUT": "/tmp/x"}
    missing = subprocess.run(["bash", script], env=node0, capture_output=True, text=True)
    assert missing.returncode != 0 and "set SPEC on node 0" in missing.stderr
