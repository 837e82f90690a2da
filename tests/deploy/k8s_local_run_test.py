#!/usr/bin/env python3
"""Runs the rendered cpu overlay's commands as local processes until the job succeeds: the
coordinator StatefulSet's container, the submit Job's container and one process per completion
index of the workers' Indexed Job (its init container first, then the node agent, which starts
the pod's ranks), each with the command, arguments and environment the manifests give
(ConfigMap and Secret references resolved, $(VAR) expanded as the kubelet does,
JOB_COMPLETION_INDEX set per pod, the image's entrypoint docker/entrypoint.sh where a container
names no command). What a cluster would provide is mapped to local things: the Service name to
127.0.0.1, container ports to free local ports (a worker pod's metrics ports, 9400 + LOCAL_RANK,
to a range of consecutive free ones, since the agent adds the local rank to its
--metrics-port-base itself), each volume mount to a folder (a claim to one folder every pod
shares, a ConfigMap or Secret to a folder holding its keys, an emptyDir to a folder of the
pod's), the pod IP to 127.0.0.1 and the node name to this host's. The Secrets' values are made
by deploy/k8s/make-secrets.sh (the rendered ones are placeholders). The readiness probes the
manifests declare are run too: the coordinator's exec probe must pass, every worker pod's
httpGet probe (its local rank 0's /metrics) must answer 200 while it trains. At the end every
agent has exited 0 and written a port file for each rank of its pod, K*nproc .. K*nproc+nproc-1
for completion index K. The agent sets each rank's LOCAL_WORLD_SIZE (its thread budget); the
workers get one thread each here, as all pods share this machine's cores. --steps N shortens the
job (the spec's latchkey.steps) for a busy machine.

Usage: k8s_local_run_test.py --deploy-dir deploy/k8s --docker-dir docker
         --coordinator BIN --worker BIN --cli BIN
Skips (77) without kubectl or openssl."""
import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k8s_common as k  # noqa: E402

# The image's ENV (docker/Dockerfile, runtime-base) that the commands rely on.
IMAGE_ENV = {"LATCHKEY_PORT_FILE": "/run/latchkey/ports.json", "OMP_NUM_THREADS": "1"}
IMAGE_DIRS = ["/run/latchkey", "/var/lib/latchkey"]  # folders the image makes


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_range(n):
    """The first of n consecutive ports that are all free now."""
    for _ in range(200):
        first = free_port()
        if first + n > 65536:
            continue
        socks = []
        try:
            for p in range(first, first + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return first
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError(f"no {n} consecutive free ports")


def metrics_ports(c):
    """The container's metrics ports (metrics, metrics-1, ...), by port number."""
    return sorted(p["containerPort"] for p in c.get("ports", [])
                  if p["name"] == "metrics" or p["name"].startswith("metrics-"))


def option(args, name):
    """The value of `name` among the agent's own flags (those before `--`), or None."""
    own = args[:args.index("--")] if "--" in args else args
    return own[own.index(name) + 1] if name in own[:-1] else None


class Pod:
    """One pod's local stand-in: its folders, its ports and its processes' environment."""

    def __init__(self, name, root, shared_claims, port_map, index=None):
        self.name = name
        self.dir = os.path.join(root, "pods", name)
        os.makedirs(self.dir)
        self.claims = shared_claims
        self.ports = port_map
        self.index = index
        self.paths = {}

    def mount(self, pod_spec, c, configmaps, secrets, claim_templates=()):
        volumes = {v["name"]: v for v in pod_spec.get("volumes", [])}
        for m in c.get("volumeMounts", []):
            if m["name"] in claim_templates:
                local = self.claims.setdefault(self.name + "/" + m["name"],
                                               os.path.join(self.dir, "claim-" + m["name"]))
            else:
                v = volumes[m["name"]]
                local = os.path.join(self.dir, c["name"] + "-" + m["name"])
                if "persistentVolumeClaim" in v:
                    claim = v["persistentVolumeClaim"]["claimName"]
                    local = self.claims.setdefault(claim, os.path.join(
                        os.path.dirname(os.path.dirname(self.dir)), "claim-" + claim))
                elif "configMap" in v:
                    # One folder per ConfigMap or Secret volume, the same in every pod (as the
                    # same path is in every container): the submit's base_dir is the same.
                    src = v["configMap"]
                    local = self.shared("configmap", src["name"], src.get("items"))
                    self.write_items(local, configmaps[src["name"]], src.get("items"), True)
                elif "secret" in v:
                    src = v["secret"]
                    local = self.shared("secret", src["secretName"], src.get("items"))
                    self.write_items(local, secrets[src["secretName"]], src.get("items"), False)
                elif "emptyDir" not in v:
                    raise AssertionError(f"{self.name}: volume {m['name']}: unknown source")
            os.makedirs(local, exist_ok=True)
            self.paths[m["mountPath"]] = local
        for d in IMAGE_DIRS:
            if d not in self.paths:
                self.paths[d] = os.path.join(self.dir, c["name"] + d.replace("/", "-"))
                os.makedirs(self.paths[d], exist_ok=True)

    def shared(self, kind, name, items):
        keys = "-".join(i["key"] for i in items) if items else "all"
        return os.path.join(os.path.dirname(os.path.dirname(self.dir)), "volumes",
                            f"{kind}-{name}-{keys}")

    def write_items(self, local, data, items, rewrite):
        """A ConfigMap's text (the spec) is made local; a Secret's bytes stay as they are."""
        if os.path.isdir(local):
            return  # written for an earlier pod (whose processes may be reading it)
        os.makedirs(local)
        for key, path in ([(i["key"], i["path"]) for i in items] if items
                          else [(key, key) for key in data]):
            with open(os.path.join(local, path), "w") as f:
                f.write(self.rewrite(data[key]) if rewrite else data[key])

    def rewrite(self, text):
        """Container paths, the Service's name, 0.0.0.0 and container ports made local."""
        for mount in sorted({**self.claim_paths(), **self.paths}, key=len, reverse=True):
            local = {**self.claim_paths(), **self.paths}[mount]
            text = re.sub(r"(?<![\w/.-])" + re.escape(mount) + r"(?=/|$|[\s\"':,=])", local, text)
        text = text.replace("latchkey-coordinator:", "127.0.0.1:").replace("0.0.0.0", "127.0.0.1")
        return re.sub(r"(?<![\d.])(%s)(?!\d)" % "|".join(str(p) for p in self.ports),
                      lambda m: str(self.ports[int(m.group(1))]), text)

    def claim_paths(self):
        return CLAIM_MOUNTS

    def environment(self, c, configmaps, secrets, path_dirs):
        env = {"PATH": os.pathsep.join(path_dirs + [os.environ.get("PATH", "/usr/bin:/bin")]),
               "HOME": self.paths["/var/lib/latchkey"]}
        for key, value in IMAGE_ENV.items():
            env[key] = self.rewrite(value)
        if self.index is not None:
            env["JOB_COMPLETION_INDEX"] = str(self.index)  # set by the Job controller
        for e in c.get("env", []):
            if "value" in e:  # only literal values are made local, never a Secret's bytes
                value = self.rewrite(expand(e["value"], env))
            else:
                src = e["valueFrom"]
                if "fieldRef" in src:
                    field = src["fieldRef"]["fieldPath"]
                    value = {"status.podIP": "127.0.0.1", "metadata.name": self.name,
                             "spec.nodeName": socket.gethostname()}[field]
                elif "configMapKeyRef" in src:
                    ref = src["configMapKeyRef"]
                    value = configmaps[ref["name"]][ref["key"]]
                else:
                    ref = src["secretKeyRef"]
                    value = secrets[ref["name"]][ref["key"]]
                if "fieldRef" in src:
                    value = self.rewrite(value)
            env[e["name"]] = value
        return env


CLAIM_MOUNTS = {}  # mountPath -> local folder, for claims (the same for every pod)


def expand(text, env):
    """The kubelet's $(VAR) expansion: defined names replaced, $$ an escaped $."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)),
                  text)


def argv(c, env, pod, entrypoint):
    command = c.get("command") or [entrypoint]
    return [pod.rewrite(expand(a, env)) for a in command + c.get("args", [])]


def start(args, env, cwd, log):
    return subprocess.Popen(args, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                            stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def tail(path, n=30):
    try:
        return "".join(open(path).readlines()[-n:])
    except OSError:
        return "(no log)"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deploy-dir", required=True)
    ap.add_argument("--docker-dir", required=True)
    ap.add_argument("--coordinator", required=True)
    ap.add_argument("--worker", required=True)
    ap.add_argument("--cli", required=True)
    ap.add_argument("--timeout", type=float, default=540)
    ap.add_argument("--steps", type=int, default=0,
                    help="lower the spec's latchkey.steps to this (0: as rendered)")
    a = ap.parse_args()
    k.kubectl()
    if shutil.which("openssl") is None:
        k.skip("openssl is not installed (make-secrets.sh makes the TLS certificate with it)")
    objects = k.render(os.path.join(a.deploy_dir, "overlays", "cpu"))
    root = tempfile.mkdtemp(prefix="latchkey-k8s-local-")
    procs = []
    ok = False
    try:
        bindir = os.path.join(root, "bin")
        os.makedirs(bindir)
        for name, target in (("latchkey-coordinator", a.coordinator),
                             ("latchkey-worker", a.worker), ("latchkey", a.cli)):
            os.symlink(os.path.abspath(target), os.path.join(bindir, name))
        entrypoint = os.path.join(os.path.abspath(a.docker_dir), "entrypoint.sh")

        # The Secrets: real values from make-secrets.sh, with exactly the rendered keys.
        made = os.path.join(root, "secrets")
        subprocess.run(["bash", os.path.join(a.deploy_dir, "make-secrets.sh"), made], check=True,
                       capture_output=True, timeout=120)
        files = {"latchkey-auth": {"auth-tokens": "auth/auth-tokens",
                                   "submit-token": "auth/submit-token"},
                 "latchkey-join": {"join-token": "join/join-token"},
                 "latchkey-tls": {"tls.crt": "tls/tls.crt", "tls.key": "tls/tls.key",
                                  "ca.crt": "tls/ca.crt"}}
        secrets = {}
        for name, keys in files.items():
            rendered = k.find(objects, "Secret", name)
            have = set(rendered.get("stringData", {})) | set(rendered.get("data", {}))
            assert have == set(keys), f"Secret {name} has keys {sorted(have)}, expected {keys}"
            secrets[name] = {key: open(os.path.join(made, f)).read() for key, f in keys.items()}
        configmaps = {o["metadata"]["name"]: o["data"] for o in objects if o["kind"] == "ConfigMap"}
        if a.steps:  # a shorter run of the same job on a busy machine; still checkpoints
            spec = json.loads(configmaps["latchkey-job"]["spec.json"])
            spec["latchkey"]["steps"] = a.steps
            configmaps["latchkey-job"]["spec.json"] = json.dumps(spec, indent=1)

        sts = k.find(objects, "StatefulSet", "latchkey-coordinator")
        submit_job = k.find(objects, "Job", "latchkey-submit")
        workers_job = k.find(objects, "Job", "latchkey-workers")
        for o in objects:  # every claim a pod mounts: one shared local folder
            if o["kind"] == "PersistentVolumeClaim":
                os.makedirs(os.path.join(root, "claim-" + o["metadata"]["name"]))
        for pod_spec in (sts["spec"]["template"]["spec"], workers_job["spec"]["template"]["spec"]):
            vols = {v["name"]: v for v in pod_spec.get("volumes", [])}
            for c in pod_spec["containers"]:
                for m in c.get("volumeMounts", []):
                    v = vols.get(m["name"], {})
                    if "persistentVolumeClaim" in v:
                        CLAIM_MOUNTS[m["mountPath"]] = os.path.join(
                            root, "claim-" + v["persistentVolumeClaim"]["claimName"])
        coord_ports = {50051: free_port(), 9464: free_port(), 29500: free_port()}
        claims = {}

        # The coordinator (StatefulSet pod 0).
        cpod_spec = sts["spec"]["template"]["spec"]
        templates = [t["metadata"]["name"] for t in sts["spec"].get("volumeClaimTemplates", [])]
        cpod = Pod("latchkey-coordinator-0", root, claims, coord_ports)
        cc = cpod_spec["containers"][0]
        cpod.mount(cpod_spec, cc, configmaps, secrets, templates)
        cenv = cpod.environment(cc, configmaps, secrets, [bindir])
        clog = os.path.join(cpod.dir, "coordinator.log")
        coordinator = start(argv(cc, cenv, cpod, entrypoint), cenv, cpod.paths["/var/lib/latchkey"],
                            clog)
        procs.append(coordinator)

        # The submit Job's pod and the workers' pods, started at once (no ordering).
        pods = []
        spod_spec = submit_job["spec"]["template"]["spec"]
        spod = Pod("latchkey-submit-x", root, claims, coord_ports)
        sc = spod_spec["containers"][0]
        spod.mount(spod_spec, sc, configmaps, secrets)
        senv = spod.environment(sc, configmaps, secrets, [bindir])
        slog = os.path.join(spod.dir, "submit.log")
        submit = start(argv(sc, senv, spod, entrypoint), senv, spod.paths["/var/lib/latchkey"],
                       slog)
        procs.append(submit)
        wspec = workers_job["spec"]
        wpod_spec = wspec["template"]["spec"]
        agent = next(c for c in wpod_spec["containers"] if c["name"] == "worker")
        assert agent["args"][0] == "node", f"the worker pods run the node agent: {agent['args']}"
        nproc = int(option(agent["args"], "--nproc"))
        declared = metrics_ports(agent)
        # 9400 + i for local rank i: the ports the agent will use are declared, in one run.
        assert declared[:nproc] == list(range(9400, 9400 + nproc)), declared
        for index in range(wspec["completions"]):
            ports = dict(coord_ports)
            first = free_port_range(len(declared))
            ports.update({p: first + p - 9400 for p in declared})
            pod = Pod(f"latchkey-workers-{index}", root, claims, ports, index)
            pod.steps = []
            for c in wpod_spec.get("initContainers", []) + wpod_spec["containers"]:
                pod.mount(wpod_spec, c, configmaps, secrets)
                env = pod.environment(c, configmaps, secrets, [bindir])
                if c["name"] == "worker":
                    # Here every pod shares this machine's cores (in a cluster each has its own).
                    env["OMP_NUM_THREADS"] = "1"
                pod.steps.append((c, argv(c, env, pod, entrypoint), env))
            # The agent's run folder: its --run-dir, else its working folder (the image's).
            run_dir = option(pod.steps[-1][1], "--run-dir")
            pod.run_dir = os.path.join(pod.paths["/var/lib/latchkey"], run_dir or ".")
            pod.proc = None
            pod.step = 0
            pod.ready = False
            pods.append(pod)

        coordinator_ready = False
        probe = cc["readinessProbe"]["exec"]["command"]
        probe = [os.path.join(a.docker_dir, os.path.basename(probe[0]))] + probe[1:]
        deadline = time.time() + a.timeout
        while time.time() < deadline:
            if coordinator.poll() is not None:
                raise AssertionError("the coordinator exited %s:\n%s" %
                                     (coordinator.returncode, tail(clog)))
            if not coordinator_ready:
                r = subprocess.run(probe, env=cenv, capture_output=True, timeout=10)
                coordinator_ready = r.returncode == 0
            for pod in pods:
                if pod.proc is None or (pod.proc.poll() == 0 and pod.step < len(pod.steps)):
                    c, args, env = pod.steps[pod.step]
                    pod.step += 1
                    pod.log = os.path.join(pod.dir, c["name"] + ".log")
                    pod.proc = start(args, env, pod.paths["/var/lib/latchkey"], pod.log)
                    procs.append(pod.proc)
                elif pod.proc.poll() not in (None, 0):
                    raise AssertionError("%s: %s exited %s:\n%s" % (
                        pod.name, pod.steps[pod.step - 1][0]["name"], pod.proc.returncode,
                        tail(pod.log)))
                if pod.step == len(pod.steps) and not pod.ready and pod.proc.poll() is None:
                    get = pod.steps[-1][0]["readinessProbe"]["httpGet"]
                    port = pod.ports[next(p["containerPort"] for p in pod.steps[-1][0]["ports"]
                                          if p["name"] == get["port"])]
                    try:
                        with urllib.request.urlopen(f"http://127.0.0.1:{port}{get['path']}",
                                                    timeout=2) as resp:
                            pod.ready = resp.status == 200
                    except OSError:
                        pass
            if submit.poll() is not None:
                break
            time.sleep(0.5)
        if submit.poll() is None:
            raise AssertionError("the job did not end within %ss; submit:\n%s" %
                                 (a.timeout, tail(slog)))
        if submit.returncode != 0:
            raise AssertionError("latchkey submit --watch exited %s:\n%s\ncoordinator:\n%s" %
                                 (submit.returncode, tail(slog), tail(clog)))
        for pod in pods:
            rc = pod.proc.wait(timeout=60)
            assert rc == 0 and pod.step == len(pod.steps), \
                f"{pod.name}: the node agent exited {rc}:\n{tail(pod.log)}"
            assert pod.ready, f"{pod.name}: its readiness probe never answered 200"
            # The pod's ranks follow from the completion index (JOB_COMPLETION_INDEX; no RANK in
            # the manifest): each wrote its port file in the agent's run folder, and local rank i
            # served its metrics on the port mapped from 9400 + i.
            for local in range(nproc):
                rank = pod.index * nproc + local
                path = os.path.join(pod.run_dir, f"worker-{rank}.port.json")
                assert os.path.exists(path), \
                    f"{pod.name}: no {path}; agent:\n{tail(pod.log)}"
                info = json.load(open(path))
                assert info["rank"] == rank, f"{pod.name}: {path} says {info}"
                assert info["metrics_port"] == pod.ports[9400 + local], \
                    f"{pod.name}: rank {rank} served metrics on {info['metrics_port']}, not " \
                    f"{pod.ports[9400 + local]} (9400 + {local})"
        assert coordinator_ready, "the coordinator's readiness probe never passed"
        job_id = configmaps["latchkey-job"]["job-id"]
        ckpt = os.path.join(CLAIM_MOUNTS["/checkpoints"], job_id)
        assert os.path.isdir(ckpt) and os.listdir(ckpt), f"no checkpoints in {ckpt}"
        print(f"job {job_id} succeeded: coordinator, submit and {len(pods)} worker pod(s) of "
              f"{nproc} ranks each (node agents) from the rendered manifests; checkpoints "
              f"{sorted(os.listdir(ckpt))}")
        print(open(slog).read()[-600:])
        ok = True
        return 0
    finally:
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, 15)
                    p.wait(timeout=15)
                except (OSError, subprocess.TimeoutExpired):
                    os.killpg(p.pid, 9)
        if ok and not os.environ.get("LATCHKEY_KEEP_TEST_DIRS"):
            shutil.rmtree(root, ignore_errors=True)
        else:
            print("kept", root)


if __name__ == "__main__":
    sys.exit(main())
