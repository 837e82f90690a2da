#!/usr/bin/env python3
"""The shipped Prometheus scrape of a TLS coordinator, with a real Prometheus.

deploy/k8s runs the coordinator with --tls-cert, so its metrics port serves HTTPS. There is no
cluster here for the pod discovery, so this test takes what the discovery would apply to the
coordinator's pod: the scheme its annotation selects through the shipped relabel rule (from
deploy/k8s/base/coordinator.yaml and deploy/prometheus/prometheus.yml) and the job's
tls_config, and scrapes a real TLS coordinator on loopback with a static copy of them. The
certificate names the Service only (as make-secrets.sh's does for a pod's IP). Passes when the
target is up and its samples arrive; a control scrape over plain http must be down.
Exit 77 (skipped) without prometheus or openssl, except under CI=true, where it fails.
"""

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

import yaml


def need(tool):
    if shutil.which(tool):
        return
    msg = f"prometheus_tls_test: {tool} not installed"
    if os.environ.get("CI") == "true":
        print(msg + " (CI=true: a missing tool is a failure)", file=sys.stderr)
        sys.exit(1)
    print(msg + ": skipped", file=sys.stderr)
    sys.exit(77)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def certificates(d):
    """A CA and a certificate for the Service name only (no IP), as deployed."""
    run = lambda *a: subprocess.run(a, cwd=d, check=True, capture_output=True)
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
        "ca.crt", "-days", "2", "-subj", "/CN=latchkey-ca")
    run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "tls.key", "-out", "tls.csr",
        "-subj", "/CN=latchkey-coordinator")
    with open(os.path.join(d, "tls.ext"), "w") as f:
        f.write("subjectAltName=DNS:latchkey-coordinator,DNS:latchkey-coordinator.default.svc\n")
    run("openssl", "x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "tls.crt", "-days", "2", "-extfile", "tls.ext")


def pod_scheme(deploy):
    """The __scheme__ the shipped relabel rule gives the coordinator's pod."""
    with open(os.path.join(deploy, "k8s/base/coordinator.yaml")) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    pod = next(d for d in docs if d.get("kind") == "StatefulSet")["spec"]["template"]
    annotations = pod["metadata"].get("annotations", {})
    value = annotations.get("latchkey.dev/scheme", "")
    with open(os.path.join(deploy, "prometheus/prometheus.yml")) as f:
        job = yaml.safe_load(f)["scrape_configs"][0]
    for rule in job.get("relabel_configs", []):
        if rule.get("target_label") == "__scheme__":
            assert rule["source_labels"] == ["__meta_kubernetes_pod_annotation_latchkey_dev_scheme"]
            m = re.fullmatch(rule["regex"], value)
            return m.expand(rule.get("replacement", "$1").replace("$", "\\")) if m else "http"
    return "http"


def scrape_up(prom_port, job):
    url = f"http://127.0.0.1:{prom_port}/api/v1/query?query=up%7Bjob%3D%22{job}%22%7D"
    with urllib.request.urlopen(url, timeout=5) as r:
        result = json.load(r)["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deploy-dir", required=True)
    ap.add_argument("--coordinator", required=True)
    a = ap.parse_args()
    need("prometheus")
    need("openssl")
    d = tempfile.mkdtemp(prefix="latchkey-prom-tls-")
    procs = []
    try:
        certificates(d)
        metrics = free_port()
        procs.append(subprocess.Popen(
            [a.coordinator, "--listen", "127.0.0.1:0", "--db", os.path.join(d, "c.db"),
             "--tls-cert", os.path.join(d, "tls.crt"), "--tls-key", os.path.join(d, "tls.key"),
             "--metrics-host", "127.0.0.1", "--metrics-port", str(metrics)],
            stdout=open(os.path.join(d, "coordinator.log"), "w"), stderr=subprocess.STDOUT))
        with open(os.path.join(a.deploy_dir, "prometheus/prometheus.yml")) as f:
            shipped = yaml.safe_load(f)["scrape_configs"][0]
        tls = dict(shipped.get("tls_config", {}))
        assert "ca_file" in tls, "the shipped scrape job has no tls_config.ca_file"
        tls["ca_file"] = os.path.join(d, "ca.crt")  # where the test mounted the CA
        scheme = pod_scheme(a.deploy_dir)
        jobs = [{"job_name": "latchkey", "scheme": scheme, "tls_config": tls,
                 "metrics_path": shipped.get("metrics_path", "/metrics"),
                 "static_configs": [{"targets": [f"127.0.0.1:{metrics}"]}]},
                {"job_name": "control-http", "scheme": "http",
                 "static_configs": [{"targets": [f"127.0.0.1:{metrics}"]}]}]
        cfg = {"global": {"scrape_interval": "1s"}, "scrape_configs": jobs}
        with open(os.path.join(d, "prometheus.yml"), "w") as f:
            yaml.safe_dump(cfg, f)
        prom = free_port()
        procs.append(subprocess.Popen(
            ["prometheus", f"--config.file={d}/prometheus.yml", f"--storage.tsdb.path={d}/tsdb",
             f"--web.listen-address=127.0.0.1:{prom}"],
            stdout=open(os.path.join(d, "prometheus.log"), "w"), stderr=subprocess.STDOUT))
        up = control = None
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                up, control = scrape_up(prom, "latchkey"), scrape_up(prom, "control-http")
            except OSError:
                pass
            if up is not None and control is not None and up == 1:
                break
            time.sleep(0.5)
        print(f"coordinator pod scheme {scheme}, tls_config {shipped.get('tls_config')}: "
              f"up {up}; plain http control: up {control}")
        if up != 1:
            print(open(os.path.join(d, "prometheus.log")).read()[-3000:], file=sys.stderr)
            return 1
        if control != 0:
            print("the plain-http control scrape was not down: the test proves nothing",
                  file=sys.stderr)
            return 1
        return 0
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
