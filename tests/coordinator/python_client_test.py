#!/usr/bin/python3
"""A client built on another gRPC implementation (Debian's python3-grpcio) talks to
latchkey-coordinator: stubs are generated from proto/ at test time, it submits a job and reads it
back, sees NOT_FOUND / INVALID_ARGUMENT as status codes, checks grpc.health.v1 and server
reflection. Run by ctest with Debian's interpreter (/usr/bin/python3)."""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import grpc
from grpc_tools import protoc

SPEC = {
    "model": {"model_type": "gpt_bigcode", "n_layer": 2, "n_embd": 64, "n_head": 8,
              "vocab_size": 256, "n_positions": 64, "multi_query": True},
    "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
    "zero_optimization": {"stage": 1},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
    "tensor_parallel": {"autotp_size": 2},
    "latchkey": {"seq_len": 32, "steps": 7, "world_size": 4, "kv_reduce": "auto",
                 "data": {"synthetic": {"seed": 3}}},
}


def generate_stubs(proto_dir, out_dir):
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    files = [os.path.join("latchkey", "v1", f)
             for f in ("types.proto", "job_service.proto", "worker_service.proto")]
    rc = protoc.main(["grpc_tools.protoc", "-I" + proto_dir, "-I" + include,
                      "--python_out=" + out_dir, "--grpc_python_out=" + out_dir] + files)
    if rc != 0:
        raise SystemExit("protoc failed: %d" % rc)
    sys.path.insert(0, out_dir)


def start_coordinator(binary, work):
    port_file = os.path.join(work, "ports.json")
    proc = subprocess.Popen([binary, "--listen", "127.0.0.1:0", "--db",
                             os.path.join(work, "coord.db"), "--metrics-port", "-1",
                             "--port-file", port_file, "--shutdown-grace", "1"])
    for _ in range(200):
        if os.path.exists(port_file):
            with open(port_file) as f:
                return proc, json.load(f)["grpc_port"]
        if proc.poll() is not None:
            raise SystemExit("coordinator exited with %d" % proc.returncode)
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("coordinator did not start")


def expect_code(fn, code):
    try:
        fn()
    except grpc.RpcError as e:
        assert e.code() == code, "want %s, got %s: %s" % (code, e.code(), e.details())
        return e.details()
    raise AssertionError("want %s, got success" % code)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--coordinator", required=True)
    ap.add_argument("--proto-dir", required=True)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="latchkey_py_")
    generate_stubs(args.proto_dir, work)
    from latchkey.v1 import job_service_pb2, job_service_pb2_grpc, types_pb2
    from latchkey.v1 import worker_service_pb2, worker_service_pb2_grpc

    proc, port = start_coordinator(args.coordinator, work)
    try:
        channel = grpc.insecure_channel("127.0.0.1:%d" % port)
        jobs = job_service_pb2_grpc.JobServiceStub(channel)
        workers = worker_service_pb2_grpc.WorkerServiceStub(channel)
        t = 10  # every call has a deadline

        sub = jobs.SubmitJob(job_service_pb2.SubmitJobRequest(spec_json=json.dumps(SPEC),
                                                              base_dir="/data"), timeout=t)
        assert sub.job_id.startswith("job-"), sub
        assert len(sub.join_token) == 32
        got = jobs.GetJob(job_service_pb2.GetJobRequest(job_id=sub.job_id), timeout=t).job
        assert got.state == types_pb2.JOB_STATE_PENDING, got
        assert (got.world_size, got.tp, got.dp, got.steps) == (4, 2, 2, 7), got
        assert got.base_dir == "/data"
        assert got.policy.kv_reduce == types_pb2.KV_REDUCE_POLICY_AUTO
        spec = json.loads(got.spec_json)  # the canonical spec: same job
        assert spec["latchkey"]["steps"] == 7 and spec["model"]["n_head"] == 8, spec
        listed = jobs.ListJobs(job_service_pb2.ListJobsRequest(), timeout=t)
        assert [j.job_id for j in listed.jobs] == [sub.job_id]

        # A rank joins from Python too.
        ident = worker_service_pb2.WorkerIdentity(job_id=sub.job_id, join_token=sub.join_token,
                                                  worker_id="py-0")
        joined = workers.Join(worker_service_pb2.JoinRequest(identity=ident), timeout=t)
        assert joined.rank == 0 and joined.world_size == 4, joined
        assert joined.rendezvous.host == "127.0.0.1" and joined.rendezvous.port > 0, joined

        bad = dict(SPEC)
        bad["zero_optimization"] = {"stage": 3}
        msg = expect_code(lambda: jobs.SubmitJob(job_service_pb2.SubmitJobRequest(
            spec_json=json.dumps(bad)), timeout=t), grpc.StatusCode.INVALID_ARGUMENT)
        assert "zero_optimization.stage" in msg, msg
        expect_code(lambda: jobs.GetJob(job_service_pb2.GetJobRequest(job_id="job-31337"),
                                        timeout=t), grpc.StatusCode.NOT_FOUND)
        wrong = worker_service_pb2.WorkerIdentity(job_id=sub.job_id, join_token="nope",
                                                  worker_id="py-1")
        expect_code(lambda: workers.Join(worker_service_pb2.JoinRequest(identity=wrong),
                                         timeout=t), grpc.StatusCode.UNAUTHENTICATED)

        # grpc.health.v1.Health/Check with hand-encoded messages (no extra package needed):
        # request {service: ""} is empty; response {status: SERVING(1)} is 08 01.
        check = channel.unary_unary("/grpc.health.v1.Health/Check")
        assert check(b"", timeout=t) == b"\x08\x01"
        svc = b"latchkey.v1.JobService"
        assert check(b"\x0a" + bytes([len(svc)]) + svc, timeout=t) == b"\x08\x01"

        # Server reflection: list_services (field 7, empty string) lists our services.
        reflect = channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
        replies = b"".join(reflect(iter([b"\x3a\x00"]), timeout=t))
        assert b"latchkey.v1.JobService" in replies and b"latchkey.v1.WorkerService" in replies

        cancelled = jobs.CancelJob(job_service_pb2.CancelJobRequest(job_id=sub.job_id),
                                   timeout=t).job
        assert cancelled.state == types_pb2.JOB_STATE_CANCELLED
        expect_code(lambda: jobs.CancelJob(job_service_pb2.CancelJobRequest(job_id=sub.job_id),
                                           timeout=t), grpc.StatusCode.FAILED_PRECONDITION)
        channel.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)
    assert rc == 0, "coordinator exit status %d" % rc
    print("python client: ok")


if __name__ == "__main__":
    main()
