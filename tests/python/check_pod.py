"""The Kubernetes pod of deploy/kubernetes/pod.yaml, checked as far as a machine without a
cluster can (tests/deploy.rs): it parses, every container runs as the pod's one user with the
memory-backed /dev/shm mounted, the group's members agree on the group and its limit, and each
container's cudapool settings are ones `cudapool run` takes (known names, good values).

usage: check_pod.py POD.yaml CUDAPOOL_COMMAND
"""
import os
import subprocess
import sys

import yaml

pod = yaml.safe_load(open(sys.argv[1]))
cli = sys.argv[2]
assert pod["kind"] == "Pod", pod["kind"]
spec = pod["spec"]
assert spec["securityContext"]["runAsUser"], "one user for the pod"
shm = [v for v in spec["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory"]
assert shm, "a memory-backed volume"
groups = set()
for c in spec["containers"]:
    assert "runAsUser" not in c.get("securityContext", {}), f"{c['name']}: no other user"
    mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
    assert mounts.get("/dev/shm") == shm[0]["name"], f"{c['name']}: /dev/shm not the pod's"
    assert c["command"][0] == "cudapool", c["command"]
    env = {e["name"]: e["value"] for e in c.get("env", [])}
    if "CUDAPOOL_GROUP" in env:
        groups.add((env["CUDAPOOL_GROUP"], env.get("CUDAPOOL_GROUP_LIMIT")))
    # cudapool run refuses unknown names and bad values (exit 2) before it starts anything.
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("CUDAPOOL_")}
    run_env.update(env)
    p = subprocess.run([cli, "run", "--", "true"], env=run_env, capture_output=True, text=True)
    assert p.returncode == 0, f"{c['name']}: {p.stderr}"
    if c["command"][1] == "exporter":
        listen = c["command"][c["command"].index("--listen") + 1]
        p = subprocess.run([cli, "exporter", "--listen", listen, "--help"], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
assert len(groups) == 1, f"every member names one group and limit: {groups}"
print("pod: ok", sorted(groups))
