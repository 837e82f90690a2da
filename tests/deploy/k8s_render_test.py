#!/usr/bin/env python3
"""Every overlay of deploy/k8s renders with `kubectl kustomize`, every rendered object validates
against the Kubernetes schemas offline (kubernetes-validate, strict: unknown fields refused),
and the objects say what the deployment relies on: the workers are an Indexed Job whose failure
policy ignores exits 75 and 76 and disruptions, whose grace period outlasts
latchkey.preemption.grace_seconds by 5 s, and that fails the job on the worker's own verdicts,
checkpoints on a ReadWriteMany volume at an absolute path, the job id shared by the submit and
the workers, the coordinator's database on a PVC, the NetworkPolicy's selectors and ports, and
what Prometheus scrapes (deploy/prometheus/prometheus.yml's keep rules applied to the worker
pod's ports). Every overlay runs one pod per node: the container runs the node agent
(`node --nproc N`), completions x N = the spec's world size, N a multiple of autotp_size (a TP
group never spans two nodes), a memory-backed /dev/shm, the node name from the downward API, at
least one requested core per local rank, and one metrics port per local rank, each scraped. The
cpu overlay does so on the CPU image with the spec's backend auto (shm inside a pod, Gloo between
pods) and no GPU; the gpu overlay with nvidia.com/gpu = N, the pods kept on distinct nodes
(required anti-affinity on the hostname) and NCCL on CUDA; the kueue overlay is the gpu overlay
with the queue label, a Job created suspended and the requests Kueue counts.

Usage: k8s_render_test.py --deploy-dir deploy/k8s --venv DIR --requirements FILE
The venv is made (Debian's python3, --system-site-packages) and the pinned requirements
installed when missing; without network to do so, or without kubectl, the test skips (77)
saying why."""
import argparse
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k8s_common as k  # noqa: E402

K8S_VERSION = "1.32.0"  # the kubectl these machines have


def ensure_venv(venv, requirements):
    python = os.path.join(venv, "bin", "python")
    stamp = os.path.join(venv, ".latchkey-requirements")
    want = open(requirements).read()
    if os.path.exists(stamp) and open(stamp).read() == want:
        return python
    if not os.path.exists(python):
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv],
                       check=True)
    r = subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        "--no-input", "-r", requirements], capture_output=True, text=True,
                       timeout=300)
    if r.returncode != 0:
        k.skip("cannot install kubernetes-validate into " + venv + " (no network to PyPI?): " +
               r.stderr.strip()[-300:])
    with open(stamp, "w") as f:
        f.write(want)
    return python


def validate(python, objects, name):
    """kubernetes-validate --strict on every object; returns the failures' lines."""
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"latchkey-k8s-{os.getpid()}-{name}.yaml")
    with open(path, "w") as f:
        f.write(k.yaml.safe_dump_all(objects))
    r = subprocess.run([python, "-m", "kubernetes_validate", "-k", K8S_VERSION, "--strict",
                        path], capture_output=True, text=True, timeout=300)
    os.unlink(path)
    passed = [line for line in r.stdout.splitlines() if " passed for resource " in line]
    if r.returncode != 0 or len(passed) != len(objects):
        return [f"{name}: kubernetes-validate exit {r.returncode}, {len(passed)} of "
                f"{len(objects)} objects passed", r.stdout[-2000:], r.stderr[-2000:]]
    return []


def container(pod_spec, name, init=False):
    for c in pod_spec.get("initContainers" if init else "containers", []):
        if c["name"] == name:
            return c
    raise AssertionError(f"no container {name}")


def check_objects(objects, overlay):
    errors = []

    def expect(cond, what):
        if not cond:
            errors.append(f"{overlay}: {what}")

    cm = k.find(objects, "ConfigMap", "latchkey-job")
    spec = json.loads(cm["data"]["spec.json"])
    job_id = cm["data"]["job-id"]
    lk = spec["latchkey"]
    workers = k.find(objects, "Job", "latchkey-workers")["spec"]
    expect(workers["completionMode"] == "Indexed", "workers are an Indexed Job")
    expect(workers["completions"] == workers["parallelism"], "completions = parallelism")
    rules = workers["podFailurePolicy"]["rules"]
    by_code = {}
    for rule in rules:
        for code in rule.get("onExitCodes", {}).get("values", []):
            by_code[code] = rule["action"]
    expect(by_code.get(75) == "Ignore", "exit 75 (restart me) is Ignore")
    expect(by_code.get(76) == "Ignore", "exit 76 (left on SIGTERM after the save) is Ignore")
    expect(by_code.get(1) == "FailJob" and by_code.get(2) == "FailJob",
           "exits 1 and 2 fail the job")
    expect(any(c.get("type") == "DisruptionTarget" and r["action"] == "Ignore"
               for r in rules for c in r.get("onPodConditions", [])),
           "disruptions are Ignore")
    pod = workers["template"]["spec"]
    expect(pod["restartPolicy"] == "Never", "podFailurePolicy needs restartPolicy Never")
    grace = lk.get("preemption", {}).get("grace_seconds", 25)
    expect(pod.get("terminationGracePeriodSeconds", 30) >= grace + 5,
           f"terminationGracePeriodSeconds >= latchkey.preemption.grace_seconds ({grace}) + 5")
    worker = container(pod, "worker")
    env = {e["name"]: e for e in worker["env"]}
    expect(env["LATCHKEY_JOB_ID"]["valueFrom"]["configMapKeyRef"]["name"] == "latchkey-job",
           "workers read the job id from the ConfigMap")
    expect(env["LATCHKEY_JOIN_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "latchkey-join",
           "workers read the join token from the Secret")
    expect("RANK" not in env, "the rank is the completion index (no RANK)")
    ckpt = lk["checkpoint"]["dir"]
    expect(os.path.isabs(ckpt), "latchkey.checkpoint.dir is absolute")
    expect(ckpt.endswith("/" + job_id), "the checkpoint folder is named after the job id")
    mounts = {m["mountPath"]: m["name"] for m in worker["volumeMounts"]}
    mount = next((p for p in mounts if ckpt.startswith(p.rstrip("/") + "/")), None)
    expect(mount is not None, "the checkpoint folder lies on a worker volume")
    if mount:
        vol = next(v for v in pod["volumes"] if v["name"] == mounts[mount])
        claim = k.find(objects, "PersistentVolumeClaim",
                       vol["persistentVolumeClaim"]["claimName"])
        expect(claim["spec"]["accessModes"] == ["ReadWriteMany"],
               "checkpoints are on a ReadWriteMany claim")
    probe = worker.get("readinessProbe", {}).get("httpGet", {})
    expect(probe.get("path") == "/metrics", "the worker's readiness is its /metrics")
    submit = container(pod, "submit", init=True)
    expect(any("latchkey submit" in a for a in submit["args"]), "the init container submits")
    sj = k.find(objects, "Job", "latchkey-submit")["spec"]["template"]["spec"]
    sargs = " ".join(container(sj, "submit")["args"])
    expect("--join-token-file" in sargs and "--watch" in sargs,
           "the submit Job sends the token's hash and follows the job")
    sts = k.find(objects, "StatefulSet", "latchkey-coordinator")["spec"]
    expect([t["metadata"]["name"] for t in sts["volumeClaimTemplates"]] == ["data"],
           "the coordinator's database is on its own claim")
    coord = container(sts["template"]["spec"], "coordinator")
    cenv = {e["name"]: e.get("value") for e in coord.get("env", [])}
    expect(cenv.get("LATCHKEY_DB") == "/var/lib/latchkey/coordinator.db",
           "the db lies on the claim")
    expect(cenv.get("LATCHKEY_AUTH_TOKENS", "").startswith("/etc/latchkey/auth/"),
           "the coordinator reads the auth tokens Secret")
    expect(all(p in coord for p in ("startupProbe", "readinessProbe", "livenessProbe")),
           "the coordinator has startup, readiness and liveness probes")
    svc = k.find(objects, "Service", "latchkey-coordinator")
    expect(sorted(p["name"] for p in svc["spec"]["ports"]) == ["grpc", "http"],
           "the Service has the gRPC and HTTP ports")
    for name in ("latchkey-auth", "latchkey-join", "latchkey-tls"):
        k.find(objects, "Secret", name)
    # The workers' store and transport ports admit the job's workers only; metrics anyone.
    np = k.find(objects, "NetworkPolicy", "latchkey-workers")["spec"]
    worker_labels = workers["template"]["metadata"]["labels"]
    expect(all(worker_labels.get(key) == v for key, v in np["podSelector"]["matchLabels"].items()),
           "the NetworkPolicy selects the worker pods")
    expect(np["policyTypes"] == ["Ingress"], "the NetworkPolicy restricts ingress")
    peers = [r for r in np["ingress"] if "from" in r]
    expect(len(peers) == 1 and "ports" not in peers[0] and
           [f.get("podSelector", {}).get("matchLabels") for f in peers[0]["from"]] ==
           [np["podSelector"]["matchLabels"]],
           "every port of a worker admits the job's workers, and no one else")
    open_rules = [r for r in np["ingress"] if "from" not in r]
    metrics_names = sorted(p["name"] for p in worker.get("ports", [])
                           if p["name"] == "metrics" or p["name"].startswith("metrics-"))
    expect(len(open_rules) == 1 and "metrics" in metrics_names and
           sorted(p["port"] for p in open_rules[0]["ports"]) == metrics_names,
           "only the named metrics ports (each one the worker declares) are open to others")
    job_meta = k.find(objects, "Job", "latchkey-workers")["metadata"]
    if overlay == "kueue":
        expect(job_meta.get("labels", {}).get("kueue.x-k8s.io/queue-name") == "latchkey",
               "the workers' Job names its Kueue LocalQueue")
        expect(workers.get("suspend") is True, "created suspended: Kueue admits it")
        requests = worker["resources"].get("requests", {})
        expect(all(r in requests for r in ("cpu", "memory", "nvidia.com/gpu")),
               "requests for Kueue's quota: cpu, memory, nvidia.com/gpu")
    else:
        expect(not workers.get("suspend"), "runs at once without a queue")
    errors += check_node_pods(overlay, spec, workers, worker)
    if overlay == "cpu":
        gpu = worker.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
        expect(gpu is None, "no GPU on the cpu overlay")
        expect(lk.get("backend") == "auto" and lk.get("device", "cpu") == "cpu",
               "the cpu overlay trains on the CPU with backend auto (shm inside a pod)")
        expect(worker["image"].endswith(":cpu"), "the CPU image")
        limits = worker.get("resources", {}).get("limits", {})
        expect("cpu" in limits and "memory" in limits, "CPU and memory limits")
    return errors


def cores(quantity):
    """A CPU quantity ("32", "500m", 4) in cores."""
    text = str(quantity)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def prometheus_keep_rules(deploy_dir):
    """The `keep` relabel rules of deploy/prometheus/prometheus.yml's latchkey job."""
    path = os.path.join(os.path.dirname(os.path.abspath(deploy_dir)), "prometheus",
                        "prometheus.yml")
    with open(path) as f:
        job = k.yaml.safe_load(f)["scrape_configs"][0]
    return [r for r in job.get("relabel_configs", []) if r.get("action") == "keep"]


KEEP_RULES = []  # set by main()


def scraped_ports(template, c):
    """The container ports of `c` (in a pod made from `template`) that Prometheus's pod
    discovery turns into targets the keep rules keep, as Prometheus applies them (one target
    per declared port; labels joined by ';'; RE2 regexes anchored at both ends)."""
    meta = template["metadata"]
    labels = {"__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", key): v
              for key, v in meta.get("labels", {}).items()}
    labels.update({"__meta_kubernetes_pod_annotation_" + re.sub(r"[^a-zA-Z0-9_]", "_", key): v
                   for key, v in meta.get("annotations", {}).items()})
    kept = []
    for p in c.get("ports", []):
        target = dict(labels, __meta_kubernetes_pod_container_port_name=p.get("name", ""),
                      __meta_kubernetes_pod_container_port_number=str(p["containerPort"]))
        if all(re.fullmatch(r["regex"], r.get("separator", ";").join(
                target.get(s, "") for s in r["source_labels"])) for r in KEEP_RULES):
            kept.append(p["containerPort"])
    return sorted(kept)


def check_node_pods(overlay, spec, workers, worker):
    """Every overlay: one pod per node running the node agent; on the gpu overlay (and kueue,
    built on it) one GPU per local rank and NCCL."""
    errors = []

    def expect(cond, what):
        if not cond:
            errors.append(f"{overlay}: {what}")

    lk = spec["latchkey"]
    pod = workers["template"]["spec"]
    args = worker.get("args", [])
    expect(args[:1] == ["node"], "the container runs the node agent (`node`)")
    nproc = int(args[args.index("--nproc") + 1]) if "--nproc" in args[:-1] else 0
    expect(nproc >= 1, "the agent is given --nproc N >= 1")
    if nproc < 1:
        return errors
    limits = worker["resources"].get("limits", {})
    requests = worker["resources"].get("requests", {})
    gpus = overlay in ("gpu", "kueue")
    if gpus:
        expect(int(limits.get("nvidia.com/gpu", 0)) == nproc,
               f"nvidia.com/gpu limit ({limits.get('nvidia.com/gpu')}) = the agent's --nproc "
               f"({nproc})")
        expect(int(requests.get("nvidia.com/gpu", nproc)) == nproc,
               "the nvidia.com/gpu request (where given) = --nproc")
    expect(workers["completions"] * nproc == lk["world_size"],
           f"completions ({workers['completions']}) x --nproc ({nproc}) = latchkey.world_size "
           f"({lk['world_size']})")
    tp = spec.get("tensor_parallel", {}).get("autotp_size", 1)
    expect(tp <= nproc and nproc % tp == 0,
           f"tensor_parallel.autotp_size ({tp}) divides --nproc ({nproc}): a TP group never "
           "spans two nodes")
    expect(cores(requests.get("cpu", "0")) >= nproc, "at least one requested core per local rank")
    omp = next((e.get("value") for e in worker.get("env", []) if e["name"] == "OMP_NUM_THREADS"),
               None)
    expect(omp is None or "cpu" not in limits or int(omp) == int(cores(limits["cpu"]) // nproc),
           f"OMP_NUM_THREADS ({omp}) is the CPU limit / --nproc (each rank's thread budget)")
    env = {e["name"]: e for e in worker.get("env", [])}
    expect("LOCAL_WORLD_SIZE" not in env and "LOCAL_RANK" not in env,
           "LOCAL_WORLD_SIZE and LOCAL_RANK are the agent's to set")
    expect(env.get("LATCHKEY_NODE_NAME", {}).get("valueFrom", {}).get("fieldRef", {})
           .get("fieldPath") == "spec.nodeName",
           "LATCHKEY_NODE_NAME is the node's name (downward API spec.nodeName)")
    if gpus:
        terms = (pod.get("affinity", {}).get("podAntiAffinity", {})
                 .get("requiredDuringSchedulingIgnoredDuringExecution", []))
        labels = dict(workers["template"]["metadata"].get("labels", {}),
                      **{"batch.kubernetes.io/job-name": "latchkey-workers",
                         "job-name": "latchkey-workers"})  # set on the pods by the Job controller
        expect(any(t.get("topologyKey") == "kubernetes.io/hostname" and
                   t.get("labelSelector", {}).get("matchLabels") and
                   all(labels.get(key) == v
                       for key, v in t["labelSelector"]["matchLabels"].items())
                   for t in terms),
               "required pod anti-affinity on kubernetes.io/hostname selects the job's own pods")
    mounts = {m["mountPath"]: m["name"] for m in worker.get("volumeMounts", [])}
    shm = next((v for v in pod.get("volumes", []) if v["name"] == mounts.get("/dev/shm")), None)
    expect(shm is not None and shm.get("emptyDir", {}).get("medium") == "Memory",
           "/dev/shm is a memory-backed emptyDir")
    if gpus:
        expect(lk.get("backend") == "nccl" and lk.get("device") == "cuda", "the spec is on NCCL")
        expect(worker["image"].endswith(":cuda"), "the CUDA image")
        expect("NCCL_SOCKET_IFNAME" in env, "NCCL settings in the environment")
        expect(env.get("NCCL_IB_DISABLE", {}).get("value", "0") == "0",
               "InfiniBand/RoCE not disabled (NCCL_IB_DISABLE unset or 0)")
    ports = {p["containerPort"]: p.get("name") for p in worker.get("ports", [])}
    wanted = list(range(9400, 9400 + nproc))
    expect("--metrics-port-base" in args and args[args.index("--metrics-port-base") + 1] == "9400",
           "local rank i serves metrics on 9400 + i (--metrics-port-base 9400)")
    expect(all(p in ports for p in wanted), f"the metrics ports 9400..{9399 + nproc} are declared")
    expect(scraped_ports(workers["template"], worker) == wanted,
           f"Prometheus scrapes exactly the {nproc} local ranks' ports "
           f"(got {scraped_ports(workers['template'], worker)})")
    return errors


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deploy-dir", required=True)
    ap.add_argument("--venv", required=True)
    ap.add_argument("--requirements", required=True)
    a = ap.parse_args()
    k.kubectl()
    overlays_dir = os.path.join(a.deploy_dir, "overlays")
    overlays = sorted(os.listdir(overlays_dir))
    if sorted(overlays) != ["cpu", "gpu", "kueue"]:
        print(f"FAIL: overlays are {overlays}, expected cpu, gpu and kueue")
        return 1
    KEEP_RULES.extend(prometheus_keep_rules(a.deploy_dir))
    python = ensure_venv(a.venv, a.requirements)
    errors = []
    for overlay in overlays:
        objects = k.render(os.path.join(overlays_dir, overlay))
        kinds = sorted(o["kind"] for o in objects)
        print(f"{overlay}: rendered {len(objects)} objects: {', '.join(kinds)}")
        errors += validate(python, objects, overlay)
        errors += check_objects(objects, overlay)
    for e in errors:
        print("FAIL:", e)
    if not errors:
        print(f"every overlay renders and validates against Kubernetes {K8S_VERSION}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
