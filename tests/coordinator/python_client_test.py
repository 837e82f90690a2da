#!/usr/bin/python3
"""A client built on another gRPC implementation (Debian's python3-grpcio) talks to
latchkey-coordinator: stubs are generated from proto/ at test time, it submits a job and reads it
back, sees NOT_FOUND / INVALID_ARGUMENT as status codes, checks grpc.health.v1 and server
reflection; then it runs a whole job as two Python ranks: WatchJob and WatchLatches streams,
Heartbeat, a mid-job UpdateJobPolicy, ReportStep for every window (with its learning rate and, on
some steps, an evaluation loss, which WatchJob and GetJob pass on as rank 0's), and the
ListLatches audit.
Run by ctest with Debian's interpreter (/usr/bin/python3). Missing python3-grpcio or grpc_tools
is a failure, not a skip."""

import argparse
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

try:
    import grpc
    from grpc_tools import protoc
except ImportError as e:  # the test must fail, not vanish, where its client is missing
    sys.stderr.write("python_client_test: %s; install python3-grpcio and python3-grpc-tools "
                     "(scripts/setup.sh)\n" % e)
    sys.exit(1)

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


# Two data-parallel ranks, managed windows of 4 micro-batches, ZeRO-1: the gate coalesces K/V.
STREAM_STEPS = 5
STREAM_SPEC = {
    "model": {"model_type": "gpt_bigcode", "n_layer": 2, "n_embd": 64, "n_head": 8,
              "vocab_size": 256, "n_positions": 64, "multi_query": True},
    "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4,
    "zero_optimization": {"stage": 1},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
    "tensor_parallel": {"autotp_size": 1},
    "latchkey": {"seq_len": 16, "steps": STREAM_STEPS, "world_size": 2, "kv_reduce": "auto",
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
    # Lookahead 1: a policy update made before any report applies from window 2.
    proc = subprocess.Popen([binary, "--listen", "127.0.0.1:0", "--db",
                             os.path.join(work, "coord.db"), "--metrics-port", "-1",
                             "--port-file", port_file, "--shutdown-grace", "1",
                             "--latch-lookahead", "1", "--liveness-timeout", "60"])
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


def consume(stream, sink, first=None):
    """Reads a server stream on a thread: every message, then an RpcError if it broke, then
    None. `first` (an Event) is set once the first message is in."""
    def run():
        try:
            for m in stream:
                sink.put(m)
                if first is not None:
                    first.set()
        except grpc.RpcError as e:
            sink.put(e)
        sink.put(None)
    threading.Thread(target=run, daemon=True).start()


def drain(sink, timeout):
    """Everything `consume` put, up to its None."""
    out = []
    while True:
        m = sink.get(timeout=timeout)
        if m is None:
            return out
        assert not isinstance(m, grpc.RpcError), "stream broke: %s %s" % (m.code(), m.details())
        out.append(m)


def step_lr(s):
    """A warmup-then-decay learning rate, as a scheduler's float64 values."""
    return 1e-3 * (s + 1) / 3 if s < 2 else 1e-3 / (s - 1) ** 0.5


def step_eval_loss(s):
    return 2.0 - 0.1 * s + 1.0 / 7


def run_streaming_job(jobs, workers, pb, t):
    """A whole job with two Python ranks, checked message by message."""
    job_service_pb2, types_pb2, worker_service_pb2, wrappers_pb2 = pb
    sub = jobs.SubmitJob(job_service_pb2.SubmitJobRequest(spec_json=json.dumps(STREAM_SPEC)),
                         timeout=t)
    job_id = sub.job_id

    # WatchJob: the job as it is, then every change until it ends.
    watched, watch_open = queue.Queue(), threading.Event()
    consume(jobs.WatchJob(job_service_pb2.WatchJobRequest(job_id=job_id), timeout=120), watched,
            watch_open)
    assert watch_open.wait(10), "WatchJob sent nothing"

    idents = []
    for r in range(2):
        ident = worker_service_pb2.WorkerIdentity(job_id=job_id, join_token=sub.join_token,
                                                  worker_id="py-rank-%d" % r)
        joined = workers.Join(worker_service_pb2.JoinRequest(
            identity=ident, requested_rank=wrappers_pb2.Int32Value(value=r)), timeout=t)
        assert (joined.rank, joined.world_size, joined.tp, joined.dp) == (r, 2, 1, 2), joined
        assert (joined.tp_rank, joined.dp_rank, joined.steps) == (0, r, STREAM_STEPS), joined
        assert joined.liveness_timeout.seconds == 60, joined
        assert joined.heartbeat_interval.seconds + joined.heartbeat_interval.nanos > 0, joined
        idents.append(ident)
    # The last rank to join starts the job.
    assert joined.state == types_pb2.JOB_STATE_RUNNING, joined
    for r in range(2):
        hb = workers.Heartbeat(worker_service_pb2.HeartbeatRequest(identity=idents[r], rank=r),
                               timeout=t)
        assert hb.state == types_pb2.JOB_STATE_RUNNING and hb.reason == "", hb
    # A worker speaking for a rank it does not hold: a rank conflict.
    msg = expect_code(lambda: workers.Heartbeat(worker_service_pb2.HeartbeatRequest(
        identity=idents[0], rank=1), timeout=t), grpc.StatusCode.ABORTED)
    assert "py-rank-1" in msg, msg

    latches = [queue.Queue(), queue.Queue()]
    for r in range(2):
        consume(workers.WatchLatches(worker_service_pb2.WatchLatchesRequest(
            identity=idents[r], rank=r, start_window=0), timeout=120), latches[r])

    def next_latch(r, window):
        m = latches[r].get(timeout=30)
        assert m is not None and not isinstance(m, grpc.RpcError), "rank %d: %s" % (r, m)
        assert m.WhichOneof("event") == "latch", m
        assert m.latch.window == window and m.latch.job_id == job_id, m
        assert m.latch.publish_time.seconds > 0, m
        return m.latch

    # Window 0 under the submitted policy.
    first = [next_latch(r, 0) for r in range(2)]
    assert first[0] == first[1], "ranks got different latches: %s vs %s" % tuple(first)
    assert (first[0].generation, first[0].first_micro_batch, first[0].micro_batches) == (0, 0, 4)
    assert first[0].kv_mode == types_pb2.KV_MODE_COALESCED, first[0]
    assert list(first[0].no_sync) == [True, True, True, False], first[0]

    # A policy change before any report: from the first window not yet published.
    upd = jobs.UpdateJobPolicy(job_service_pb2.UpdateJobPolicyRequest(
        job_id=job_id, kv_reduce=types_pb2.KV_REDUCE_POLICY_PER_MICRO_BATCH,
        gradient_accumulation_steps=wrappers_pb2.Int32Value(value=2),
        expected_generation=wrappers_pb2.Int64Value(value=0)), timeout=t)
    assert upd.policy.generation == 1, upd
    assert upd.policy.kv_reduce == types_pb2.KV_REDUCE_POLICY_PER_MICRO_BATCH, upd
    assert upd.policy.gradient_accumulation_steps == 2, upd
    changed_at = upd.first_window
    assert 1 <= changed_at <= 2, upd  # windows 0 .. lookahead (1) were already published
    expect_code(lambda: jobs.UpdateJobPolicy(job_service_pb2.UpdateJobPolicyRequest(
        job_id=job_id, gradient_accumulation_steps=wrappers_pb2.Int32Value(value=3),
        expected_generation=wrappers_pb2.Int64Value(value=0)), timeout=t),
        grpc.StatusCode.ABORTED)
    # Steps run only once their latch is published.
    expect_code(lambda: workers.ReportStep(worker_service_pb2.ReportStepRequest(
        identity=idents[0], rank=0, step=STREAM_STEPS - 1, micro_batches=2,
        kv_mode=types_pb2.KV_MODE_PER_MICRO_BATCH, latch_generation=1), timeout=t),
        grpc.StatusCode.FAILED_PRECONDITION)

    rank0_latches, m_next = [], 0
    for s in range(STREAM_STEPS):
        got = first if s == 0 else [next_latch(r, s) for r in range(2)]
        assert got[0] == got[1], "window %d: ranks got different latches" % s
        latch = got[0]
        after = s >= changed_at
        assert latch.generation == (1 if after else 0), latch
        assert latch.micro_batches == (2 if after else 4), latch
        assert latch.kv_mode == (types_pb2.KV_MODE_PER_MICRO_BATCH if after
                                 else types_pb2.KV_MODE_COALESCED), latch
        assert latch.first_micro_batch == m_next, "data order broken at window %d" % s
        assert len(latch.no_sync) == latch.micro_batches and not latch.no_sync[-1], latch
        m_next += latch.micro_batches
        rank0_latches.append(latch)
        if s == changed_at:  # a step that ran under the old generation is refused
            expect_code(lambda: workers.ReportStep(worker_service_pb2.ReportStepRequest(
                identity=idents[1], rank=1, step=s, micro_batches=4,
                kv_mode=types_pb2.KV_MODE_COALESCED, latch_generation=0), timeout=t),
                grpc.StatusCode.ABORTED)
        for r in (1, 0):  # rank 0 last: the summary must still be rank 0's
            req = worker_service_pb2.ReportStepRequest(
                identity=idents[r], rank=r, step=s, micro_batches=latch.micro_batches,
                loss=3.0 - 0.25 * s + 0.5 * r, grad_norm=1.5, kv_mode=latch.kv_mode,
                kv_allreduce_calls=latch.micro_batches if after else 1,
                collective_calls={"all_reduce/dp": 2}, step_seconds=0.1 + 0.2 * r,
                tokens=4096, latch_generation=latch.generation, lr=step_lr(s) + r)
            # Rank 0 evaluates on odd steps only; rank 1's numbers never reach the summary.
            if r == 1 or s % 2 == 1:
                req.eval_loss.value = step_eval_loss(s) + r
            resp = workers.ReportStep(req, timeout=t)
            last = s == STREAM_STEPS - 1 and r == 0
            assert not resp.duplicate, (s, r, resp)
            assert resp.state == (types_pb2.JOB_STATE_SUCCEEDED if last
                                  else types_pb2.JOB_STATE_RUNNING), (s, r, resp)
            if s == 0 and r == 1:  # a retried report is recognised, not counted twice
                again = workers.ReportStep(req, timeout=t)
                assert again.duplicate and again.state == types_pb2.JOB_STATE_RUNNING, again

    # Both latch streams end with the job's end.
    for r in range(2):
        tail = drain(latches[r], 30)
        assert len(tail) == 1 and tail[0].WhichOneof("event") == "job_ended", tail
        assert tail[0].job_ended.state == types_pb2.JOB_STATE_SUCCEEDED, tail

    # WatchJob saw the job from pending to succeeded, each step once, with rank 0's numbers.
    seen = drain(watched, 30)
    assert seen[0].job.state == types_pb2.JOB_STATE_PENDING, seen[0]
    assert seen[-1].job.state == types_pb2.JOB_STATE_SUCCEEDED, seen[-1]
    assert seen[-1].job.steps_completed == STREAM_STEPS, seen[-1]
    steps = [m.step for m in seen if m.HasField("step")]
    assert [st.step for st in steps] == list(range(STREAM_STEPS)), steps
    for st, latch in zip(steps, rank0_latches):
        assert abs(st.loss - (3.0 - 0.25 * st.step)) < 1e-12, st
        assert abs(st.step_seconds - 0.3) < 1e-12, st  # the slowest rank's
        assert (st.ranks_reported, st.tokens, st.grad_norm) == (2, 4096, 1.5), st
        assert (st.micro_batches, st.kv_mode) == (latch.micro_batches, latch.kv_mode), st
        assert st.lr == step_lr(st.step), st  # float64 on the wire, exact
        # The evaluation loss is there exactly on the steps rank 0 evaluated (a wrapper: unset
        # is "no evaluation", never 0).
        assert st.HasField("eval_loss") == (st.step % 2 == 1), st
        if st.step % 2 == 1:
            assert st.eval_loss.value == step_eval_loss(st.step), st

    # ListLatches: the audit is exactly what the ranks were sent, and the change behind it.
    audit = jobs.ListLatches(job_service_pb2.ListLatchesRequest(job_id=job_id), timeout=t)
    assert len(audit.latches) == STREAM_STEPS, audit
    for stored, sent in zip(audit.latches, rank0_latches):
        # Publish times included: the stream serves exactly what the store keeps.
        assert stored == sent, "window %d: audit %s vs sent %s" % (sent.window, stored, sent)
    assert audit.next_start_window == 0, audit
    changes = [c for c in audit.policy_changes if c.policy.generation == 1]
    assert len(changes) == 1 and changes[0].first_window == changed_at, audit.policy_changes
    assert changes[0].policy.gradient_accumulation_steps == 2, changes[0]
    assert changes[0].change_time.seconds > 0, changes[0]
    page = jobs.ListLatches(job_service_pb2.ListLatchesRequest(
        job_id=job_id, start_window=1, page_size=2), timeout=t)
    assert [l.window for l in page.latches] == [1, 2] and page.next_start_window == 3, page
    expect_code(lambda: jobs.ListLatches(job_service_pb2.ListLatchesRequest(job_id="job-31337"),
                                         timeout=t), grpc.StatusCode.NOT_FOUND)

    done = jobs.GetJob(job_service_pb2.GetJobRequest(job_id=job_id), timeout=t).job
    assert done.state == types_pb2.JOB_STATE_SUCCEEDED and done.steps_completed == STREAM_STEPS
    assert done.last_step.step == STREAM_STEPS - 1 and done.policy.generation == 1, done
    assert done.last_step.lr == step_lr(STREAM_STEPS - 1), done.last_step
    # The last step (4) ran no evaluation on rank 0.
    assert not done.last_step.HasField("eval_loss"), done.last_step
    assert [(w.rank, w.dp_rank, w.state, w.steps_reported) for w in done.workers] == [
        (r, r, types_pb2.WORKER_STATE_DONE, STREAM_STEPS) for r in range(2)], done.workers
    hb = workers.Heartbeat(worker_service_pb2.HeartbeatRequest(identity=idents[0], rank=0),
                           timeout=t)
    assert hb.state == types_pb2.JOB_STATE_SUCCEEDED, hb
    expect_code(lambda: jobs.UpdateJobPolicy(job_service_pb2.UpdateJobPolicyRequest(
        job_id=job_id, kv_reduce=types_pb2.KV_REDUCE_POLICY_DEFERRED), timeout=t),
        grpc.StatusCode.FAILED_PRECONDITION)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--coordinator", required=True)
    ap.add_argument("--proto-dir", required=True)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="latchkey_py_")
    generate_stubs(args.proto_dir, work)
    from latchkey.v1 import job_service_pb2, job_service_pb2_grpc, types_pb2
    from latchkey.v1 import worker_service_pb2, worker_service_pb2_grpc
    from google.protobuf import wrappers_pb2

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

        run_streaming_job(jobs, workers,
                          (job_service_pb2, types_pb2, worker_service_pb2, wrappers_pb2), t)
        channel.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)
    assert rc == 0, "coordinator exit status %d" % rc
    print("python client: ok")


if __name__ == "__main__":
    main()
