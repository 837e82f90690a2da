#!/usr/bin/env python3
"""scripts/gpu-check.sh's helper: the specs it runs, the runs, each stage's record and the table.

    record OUT NAME STATUS SECONDS SUMMARY [DETAIL_FILE]   OUT/stage-NAME.json
    run-fixture WORKER ROOT DEVICE DIR     the fixture's 6-step TP 1 fp32 run (DIR/steps-0.jsonl)
    run-numerics WORKER ROOT DEVICE DIR    that run, then every one-rank run of
                                           testdata/gptbigcode-tiny/expected.json
                                           (DIR/fixture/VARIANT-runI/steps-0.jsonl)
    fixture-gap ROOT DIR TOL               "4 fixture runs, max |cpu - fixture| ..." of DIR;
                                           exit 0 when within TOL
    compare-fixture-runs ROOT CPU_DIR CUDA_DIR TOL
                                           exit 0 when every step of every such run agrees
                                           between CPU_DIR and CUDA_DIR within TOL; prints
                                           both devices' distance to the fixture too
    run-throughput WORKER DEVICE DIR       the ~350M GPTBigCode MQA bf16 run (DIR/steps-0.jsonl)
    run-memory WORKER DEVICE DIR GPUS      that model at seq 2048, MB 1: activation checkpointing
                                           none and selective at TP 1, and with GPUS >= 2 TP 2
                                           with and without sequence parallelism + selective
                                           (DIR/NAME/steps-R.jsonl); on cpu a tiny model
    memory DIR                             the table of those runs: peak and activation bytes
                                           per rank, tokens/s; exit 1 when a run or a field is
                                           missing
    run-agent WORKER CLI COORDINATOR DEVICE NPROC DIR
                                           the node agent on this machine: a coordinator on
                                           loopback, `latchkey submit`, `latchkey node --nproc
                                           NPROC` with DIR/run as its run folder; exit 0 when
                                           the agent and the job succeeded and every rank's
                                           steps-R.jsonl holds every step (last line: summary)
    summarize-steps JSONL                  "6 steps, last loss ..."
    compare-steps A B TOL                  exit 0 when every step's loss and grad_norm agree
    throughput JSONL NAME PROBE            tokens/s and MFU of a latchkey run (OUT/rate-NAME.json)
    peer LOG                               the same from gpu_peer.py's summary line
    table OUT TOTAL_SECONDS                every stage recorded so far, and the ratio
"""

import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import time

# The throughput model: GPTBigCode MQA, ~349M parameters (bench/peer/gpu_peer.py's defaults).
MODEL = {"model_type": "gpt_bigcode", "n_layer": 28, "n_embd": 1024, "n_head": 16,
         "vocab_size": 49152, "n_positions": 1024, "multi_query": True}
SEQ, MB, STEPS, WARMUP = 1024, 8, 8, 3
PEAKS = [("H200", 989.0), ("H100", 989.0), ("A100", 312.0), ("L40S", 362.0), ("A10", 125.0)]
ORDER = ["probe", "build", "nccl", "numerics", "agent", "latchkey", "memory", "peer"]


def params(m):
    d, layers, hd = m["n_embd"], m["n_layer"], m["n_embd"] // m["n_head"]
    kv = 2 * hd if m["multi_query"] else 2 * d
    block = (2 * 2 * d) + (d * (d + kv) + d + kv) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d)
    return m["vocab_size"] * d + m["n_positions"] * d + layers * block + 2 * d


def flops_per_token(m, seq):
    return 6 * params(m) + 12 * m["n_layer"] * m["n_embd"] * seq


def jsonl(path):
    rows = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                r = json.loads(line)
                if "step" in r:
                    rows[r["step"]] = r  # the last record of a step counts
    return [rows[k] for k in sorted(rows)]


def run_worker(worker, spec, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "spec.json"), "w") as f:
        json.dump(spec, f, indent=1)
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", LOCAL_RANK="0",
               MASTER_PORT=str(29600 + os.getpid() % 1000))
    return subprocess.call([worker, "--standalone", "--spec", os.path.join(out_dir, "spec.json"),
                            "--metrics-jsonl", os.path.join(out_dir, "steps-0.jsonl"), "--quiet"],
                           env=env)


def fixture_spec(root, device, variant="mqa"):
    """The 6-step TP 1 fp32 run from the fixture's `variant` checkpoint."""
    fx = os.path.join(root, "testdata", "gptbigcode-tiny")
    with open(os.path.join(fx, variant, "config.json")) as f:
        c = json.load(f)
    model = {k: c[k] for k in ("n_layer", "n_embd", "n_head", "vocab_size", "n_positions",
                               "multi_query")}
    model["model_type"] = "gpt_bigcode"
    return {"model": model, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
            "optimizer": {"type": "SGD", "params": {"lr": 0.5}}, "gradient_clipping": 0.0,
            "zero_optimization": {"stage": 0}, "tensor_parallel": {"autotp_size": 1},
            "latchkey": {"seq_len": 32, "steps": 6, "seed": 1, "world_size": 1,
                         "kv_reduce": "per_micro_batch", "device": device, "tf32": False,
                         "init_from": os.path.join(fx, variant),
                         "data": {"tokens_file": os.path.join(fx, "tokens.bin"),
                                  "dtype": "uint16"}}}


def fixture_runs(root):
    """(name, variant, run) of every one-rank run of the fixture (an independent float64 run)."""
    fx = os.path.join(root, "testdata", "gptbigcode-tiny")
    with open(os.path.join(fx, "expected.json")) as f:
        e = json.load(f)
    out = []
    for variant, v in e["variants"].items():
        for i, run in enumerate(v["runs"]):
            if run["DP"] != 1:
                continue  # NCCL refuses two ranks on one GPU
            out.append((f"{variant}-run{i}", variant, run))
    return out


def fixture_run_spec(root, variant, run, device):
    """fixture_spec with the shape, optimizer and length of one fixture run."""
    spec = fixture_spec(root, device, variant)
    spec["train_micro_batch_size_per_gpu"] = run["MB"]
    spec["gradient_accumulation_steps"] = run["GAS"]
    spec["optimizer"] = {"type": run["optimizer"], "params": {"lr": run["lr"]}}
    spec["gradient_clipping"] = run["clip"]
    spec["latchkey"]["steps"] = run["steps"]
    spec["latchkey"]["kv_reduce"] = "auto"
    return spec


def worst_step_gap(a, b):
    """max |a - b| over every step's loss and grad_norm (None when the step counts differ)."""
    if len(a) != len(b) or not a:
        return None
    return max(max(abs(x["loss"] - y["loss"]), abs(x["grad_norm"] - y["grad_norm"]))
               for x, y in zip(a, b))


def fixture_gaps(root, sides):
    """Over every fixture run: the largest step gap of each side (name -> folder of
    run-numerics' fixture/) to the fixture ("NAME-fixture") and between sides ("A-B").
    (number of runs, {pair: gap}), or (None, the reason) when step counts differ."""
    runs = fixture_runs(root)
    names = list(sides)
    worst = {}
    for name, _, run in runs:
        steps = {s: jsonl(os.path.join(d, name, "steps-0.jsonl")) for s, d in sides.items()}
        pairs = [(f"{s}-fixture", steps[s], run["per_step"]) for s in names]
        pairs += [(f"{a}-{b}", steps[a], steps[b])
                  for i, a in enumerate(names) for b in names[i + 1:]]
        for key, x, y in pairs:
            gap = worst_step_gap(x, y)
            if gap is None:
                return None, f"{name}: {key}: step counts differ ({len(x)} and {len(y)})"
            worst[key] = max(worst.get(key, 0.0), gap)
    return len(runs), worst


def throughput_spec(device):
    return {"model": MODEL, "train_micro_batch_size_per_gpu": MB, "gradient_accumulation_steps": 1,
            "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.01}},
            "gradient_clipping": 1.0, "zero_optimization": {"stage": 0}, "bf16": {"enabled": True},
            "tensor_parallel": {"autotp_size": 1},
            "latchkey": {"seq_len": SEQ, "steps": STEPS, "seed": 1, "world_size": 1,
                         "device": device, "data": {"synthetic": {"seed": 1}}}}


MEMORY_SEQ = 2048
TINY = {"model_type": "gpt_bigcode", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 256,
        "n_positions": 64, "multi_query": True}


def memory_runs(device, gpus):
    """(name, model, seq, tp, sequence_parallel, recompute mode) of the memory stage."""
    model, seq = (dict(MODEL, n_positions=MEMORY_SEQ), MEMORY_SEQ) if device == "cuda" else (TINY, 64)
    runs = [("tp1-none", model, seq, 1, False, "none"),
            ("tp1-selective", model, seq, 1, False, "selective")]
    if gpus >= 2 or device == "cpu":
        runs += [("tp2-none", model, seq, 2, False, "none"),
                 ("tp2-sp-selective", model, seq, 2, True, "selective")]
    return runs


def memory_spec(device, model, seq, tp, sp, mode):
    return {"model": model, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
            "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.01}},
            "gradient_clipping": 1.0, "zero_optimization": {"stage": 0},
            "bf16": {"enabled": device == "cuda"},
            "tensor_parallel": {"autotp_size": tp, "sequence_parallel": sp},
            "latchkey": {"seq_len": seq, "steps": 5, "seed": 1, "world_size": tp, "device": device,
                         "activation_checkpointing": {"mode": mode},
                         "data": {"synthetic": {"seed": 1}}}}


def run_ranks(worker, spec, out_dir, world):
    """Runs `world` standalone ranks of `spec` (one per GPU); 0 when every rank succeeded."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "spec.json"), "w") as f:
        json.dump(spec, f, indent=1)
    port = str(29700 + os.getpid() % 1000)
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                   LOCAL_RANK=str(r), MASTER_PORT=port)
        procs.append(subprocess.Popen(
            [worker, "--standalone", "--spec", os.path.join(out_dir, "spec.json"),
             "--metrics-jsonl", os.path.join(out_dir, "steps-{rank}.jsonl"), "--quiet"], env=env))
    return max(p.wait() for p in procs)


def memory_table(out_dir, runs):
    lines, ok = [], True
    lines.append("| run | tp | sp | recompute | peak GiB (max rank) | activation GiB | reserved GiB |"
                 " tokens/s |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for name, _, _, tp, sp, mode in runs:
        ranks = [jsonl(os.path.join(out_dir, name, f"steps-{r}.jsonl"))
                 if os.path.exists(os.path.join(out_dir, name, f"steps-{r}.jsonl")) else []
                 for r in range(tp)]
        rows = [row for rank in ranks for row in rank[1:]]  # the first step holds the warm-up
        if not rows or any("peak_memory_bytes" not in row for row in rows):
            lines.append(f"| {name} | {tp} | {sp} | {mode} | missing | | | |")
            ok = False
            continue
        gib = 1024.0 ** 3
        peak = max(row["peak_memory_bytes"] for row in rows) / gib
        act = max(row.get("activation_memory_bytes", 0) for row in rows) / gib
        res = max(row.get("reserved_memory_bytes", 0) for row in rows) / gib
        tps = statistics.median(r["tokens"] / r["step_seconds"] for r in ranks[0][1:])
        lines.append(f"| {name} | {tp} | {sp} | {mode} | {peak:.3f} | {act:.3f} | {res:.3f} |"
                     f" {tps:.0f} |")
    return ok, "\n".join(lines)


# The agent stage's model: TP = NPROC where its heads (and n_inner) divide, else 1 (all DP).
AGENT_MODEL = {"cpu": TINY,
               "cuda": {"model_type": "gpt_bigcode", "n_layer": 4, "n_embd": 512, "n_head": 8,
                        "vocab_size": 1024, "n_positions": 128, "multi_query": True}}
AGENT_STEPS = {"cpu": 4, "cuda": 20}
AGENT_JOB = "gpu-check-agent"


def agent_spec(device, nproc):
    model = AGENT_MODEL[device]
    inner = 4 * model["n_embd"]
    tp = nproc if model["n_head"] % nproc == 0 and inner % nproc == 0 else 1
    return {"model": model, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}},
            "gradient_clipping": 1.0, "zero_optimization": {"stage": 1},
            "tensor_parallel": {"autotp_size": tp},
            "latchkey": {"seq_len": 64, "steps": AGENT_STEPS[device], "seed": 1,
                         "world_size": nproc, "device": device,
                         "backend": "nccl" if device == "cuda" else "shm",
                         "data": {"synthetic": {"seed": 1}}}}


def stop(proc, grace):
    """SIGTERM, then SIGKILL after `grace` seconds; the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def last_line(path):
    try:
        with open(path, errors="replace") as f:
            lines = [line.strip() for line in f if line.strip()]
        return lines[-1] if lines else "(empty)"
    except OSError:
        return "(none)"


def run_agent(worker, cli, coordinator, device, nproc, out_dir):
    """The agent stage (see the usage above). Every child is ended before it returns; its own
    deadlines add up to under the 300 s gpu-check.sh gives the stage."""
    run_dir = os.path.join(out_dir, "run")
    os.makedirs(run_dir, exist_ok=True)
    spec = agent_spec(device, nproc)
    tp, steps = spec["tensor_parallel"]["autotp_size"], spec["latchkey"]["steps"]
    spec_path = os.path.join(out_dir, "spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f, indent=1)
    token_path = os.path.join(out_dir, "join-token")
    with open(os.open(token_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(secrets.token_hex(32) + "\n")
    # Only what this stage sets: no outside coordinator, job, token, TLS or rank.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("LATCHKEY_") and k not in (
               "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "JOB_COMPLETION_INDEX")}
    env["XDG_CONFIG_HOME"] = os.path.join(out_dir, "config")
    ports = os.path.join(out_dir, "ports.json")
    coord = subprocess.Popen(
        [coordinator, "--listen", "127.0.0.1:0", "--db", os.path.join(out_dir, "coordinator.db"),
         "--metrics-port", "-1", "--port-file", ports, "--shutdown-grace", "1",
         "--cancel-on-shutdown"], env=env,
        stdout=open(os.path.join(out_dir, "coordinator.log"), "w"), stderr=subprocess.STDOUT)
    agent = None
    try:
        deadline = time.time() + 30
        while not os.path.exists(ports) and coord.poll() is None and time.time() < deadline:
            time.sleep(0.1)
        if not os.path.exists(ports):
            print("the coordinator did not start: " +
                  last_line(os.path.join(out_dir, "coordinator.log")))
            return 1
        with open(ports) as f:
            addr = f"127.0.0.1:{json.load(f)['grpc_port']}"
        base = [cli, "--coordinator", addr]
        # A free port for rank 0's store, as `latchkey up` picks one: the coordinator's default
        # range starts at the same port for every coordinator on this host, so two checks at
        # once would find each other's store.
        with socket.socket() as sock:
            sock.bind(("", 0))
            store_port = sock.getsockname()[1]
        r = subprocess.run(base + ["submit", spec_path, "--job-id", AGENT_JOB,
                                   "--join-token-file", token_path,
                                   "--rendezvous-port", str(store_port)], env=env, timeout=60,
                           capture_output=True, text=True)
        print(r.stdout + r.stderr, end="")
        if r.returncode != 0:
            print(f"latchkey submit exited {r.returncode}")
            return 1
        t0 = time.time()
        agent = subprocess.Popen(
            base + ["node", "--nproc", str(nproc), "--job", AGENT_JOB, "--node-rank", "0",
                    "--node-name", "gpu-check", "--run-dir", run_dir,
                    "--join-token-file", token_path, "--worker", worker], env=env)
        try:
            rc = agent.wait(timeout=180)
        except subprocess.TimeoutExpired:
            rc = stop(agent, 15)
            print(f"latchkey node did not finish within 180 s (stopped: exit {rc}); "
                  f"node-0.log: {last_line(os.path.join(run_dir, 'node-0.log'))}")
            return 1
        secs = time.time() - t0
        r = subprocess.run(base + ["--json", "status", AGENT_JOB], env=env, timeout=30,
                           capture_output=True, text=True)
        lines = r.stdout.splitlines()
        job = json.loads(lines[0]) if r.returncode == 0 and lines else {}
        state = job.get("state", f"unknown (status exit {r.returncode})")
        problems = []
        if rc != 0:
            problems.append(f"latchkey node exited {rc} (node-0.log: "
                            f"{last_line(os.path.join(run_dir, 'node-0.log'))})")
        if state != "JOB_STATE_SUCCEEDED":
            problems.append(f"the job is {state} {job.get('failure_reason', '')}".strip())
        for rank in range(nproc):
            path = os.path.join(run_dir, f"steps-{rank}.jsonl")
            rows = jsonl(path) if os.path.exists(path) else []
            if [row["step"] for row in rows] != list(range(steps)):
                problems.append(f"rank {rank}: steps-{rank}.jsonl has {len(rows)} of {steps} "
                                "steps")
            elif any(row.get("rank") != rank for row in rows):
                problems.append(f"rank {rank}: steps-{rank}.jsonl holds another rank's records")
            elif tp > 1 and not all(row.get("collective_calls", {}).get("all_reduce/tp")
                                    for row in rows):
                problems.append(f"rank {rank}: a step without TP all-reduces")
        if problems:
            print("; ".join(problems))
            return 1
        backend = spec["latchkey"]["backend"]
        print(f"one node, {nproc} ranks (TP {tp}, DP {nproc // tp}, {backend} on {device}): "
              f"{steps} steps on every rank, job succeeded, {job.get('restarts', 0)} restarts, "
              f"{secs:.0f} s")
        return 0
    finally:
        if agent is not None:
            stop(agent, 15)
        stop(coord, 10)


def peak_of(name):
    return next((t for k, t in PEAKS if k in name), 0.0)


def rate_line(r):
    mfu = r.get("mfu")
    return (f"{r['tokens_per_second']:.0f} tokens/s, {r['achieved_tflops']:.1f} TFLOPS, "
            f"MFU {mfu * 100:.1f}% of {r['peak_tflops']:.0f}" if mfu is not None else
            f"{r['tokens_per_second']:.1f} tokens/s (no peak for this device)")


def main(argv):
    cmd = argv[0]
    if cmd == "record":
        out, name, status, secs, summary = argv[1:6]
        detail = argv[6] if len(argv) > 6 else ""
        rec = {"stage": name, "status": status, "seconds": int(secs or 0), "summary": summary,
               "detail": detail}
        with open(os.path.join(out, f"stage-{name}.json"), "w") as f:
            json.dump(rec, f)
        print(f"gpu-check: {name}: {status} ({secs} s) {summary}", file=sys.stderr)
    elif cmd == "run-fixture":
        worker, root, device, out_dir = argv[1:5]
        return run_worker(worker, fixture_spec(root, device), out_dir)
    elif cmd == "run-numerics":
        worker, root, device, out_dir = argv[1:5]
        rc = run_worker(worker, fixture_spec(root, device), out_dir)
        if rc != 0:
            print(f"the 6-step run on {device}: latchkey-worker exited {rc}")
            return 1
        for name, variant, run in fixture_runs(root):
            rc = run_worker(worker, fixture_run_spec(root, variant, run, device),
                            os.path.join(out_dir, "fixture", name))
            if rc != 0:
                print(f"{name} on {device}: latchkey-worker exited {rc}")
                return 1
        return 0
    elif cmd == "fixture-gap":
        root, d, tol = argv[1], argv[2], float(argv[3])
        n, worst = fixture_gaps(root, {"cpu": d})
        if n is None:
            print(worst)
            return 1
        print(f"{n} fixture runs, max |cpu - fixture| {worst['cpu-fixture']:.2e} (tol {tol:g})")
        return 0 if worst["cpu-fixture"] <= tol else 1
    elif cmd == "compare-fixture-runs":
        root, cpu_dir, cuda_dir, tol = argv[1], argv[2], argv[3], float(argv[4])
        n, worst = fixture_gaps(root, {"cpu": cpu_dir, "cuda": cuda_dir})
        if n is None:
            print(worst)
            return 1
        print(f"{n} fixture runs: max |cpu - cuda| {worst['cpu-cuda']:.2e} (tol {tol:g}); "
              f"to the fixture: cpu {worst['cpu-fixture']:.2e}, cuda {worst['cuda-fixture']:.2e}")
        return 0 if worst["cpu-cuda"] <= tol else 1
    elif cmd == "run-throughput":
        worker, device, out_dir = argv[1:4]
        return run_worker(worker, throughput_spec(device), out_dir)
    elif cmd == "run-memory":
        worker, device, out_dir, gpus = argv[1], argv[2], argv[3], int(argv[4])
        worst = 0
        for name, model, seq, tp, sp, mode in memory_runs(device, gpus):
            worst = max(worst, run_ranks(worker, memory_spec(device, model, seq, tp, sp, mode),
                                         os.path.join(out_dir, name), tp))
        return worst
    elif cmd == "memory":
        out_dir, device, gpus = argv[1], argv[2], int(argv[3])
        ok, table = memory_table(out_dir, memory_runs(device, gpus))
        with open(os.path.join(out_dir, "memory-table.md"), "w") as f:
            f.write(table + "\n")
        print(table.splitlines()[-1] if ok else "a run or its memory fields are missing")
        return 0 if ok else 1
    elif cmd == "run-agent":
        worker, cli, coordinator, device, nproc, out_dir = argv[1:7]
        return run_agent(worker, cli, coordinator, device, int(nproc), out_dir)
    elif cmd == "summarize-steps":
        rows = jsonl(argv[1])
        print(f"{len(rows)} steps, last loss {rows[-1]['loss']:.6f}" if rows else "no steps")
    elif cmd == "compare-steps":
        a, b, tol = jsonl(argv[1]), jsonl(argv[2]), float(argv[3])
        worst = worst_step_gap(a, b)
        if worst is None:
            print(f"steps differ: cpu {len(a)}, cuda {len(b)}")
            return 1
        print(f"{len(a)} steps, max |cpu - cuda| of loss and grad_norm {worst:.2e} (tol {tol:g})")
        return 0 if worst <= tol else 1
    elif cmd == "throughput":
        rows = jsonl(argv[1])[WARMUP:]
        if not rows:
            print("no measured steps")
            return 1
        gpu = ""
        with open(argv[3]) as f:
            for line in f:
                if line.startswith("gpu: "):
                    gpu = line[5:].strip()
                    break
        tps = statistics.median(r["tokens"] / r["step_seconds"] for r in rows)
        fpt = flops_per_token(MODEL, SEQ)
        peak = peak_of(gpu)
        ach = tps * fpt / 1e12
        r = {"tokens_per_second": tps, "achieved_tflops": ach, "peak_tflops": peak,
             "mfu": ach / peak if peak else None, "params": params(MODEL)}
        with open(os.path.join(os.path.dirname(os.path.dirname(argv[1])),
                               f"rate-{argv[2]}.json"), "w") as f:
            json.dump(r, f)
        print(rate_line(r))
    elif cmd == "peer":
        summary = None
        try:
            with open(argv[1]) as f:
                for line in f:
                    if line.startswith('{"summary"'):
                        summary = json.loads(line)["summary"]
        except OSError:
            pass
        if summary is None:
            print("no summary line")
            return 1
        with open(os.path.join(os.path.dirname(argv[1]), "rate-peer.json"), "w") as f:
            json.dump(summary, f)
        print(f"{summary['params'] / 1e6:.1f}M params on {summary['device']}: " +
              rate_line(summary))
    elif cmd == "table":
        out, total = argv[1], argv[2]
        rows = []
        for name in ORDER:
            p = os.path.join(out, f"stage-{name}.json")
            if os.path.exists(p):
                with open(p) as f:
                    r = json.load(f)
            else:
                r = {"stage": name, "status": "not run", "seconds": 0, "summary": "(cut off)"}
            rows.append(r)
        print(f"| stage    | status   | seconds | result")
        print(f"|----------|----------|---------|-------")
        for r in rows:
            print(f"| {r['stage']:<8} | {r['status']:<8} | {r['seconds']:>7} | {r['summary']}")
        rates = {}
        for n in ("latchkey", "peer"):
            p = os.path.join(out, f"rate-{n}.json")
            if os.path.exists(p):
                with open(p) as f:
                    rates[n] = json.load(f)
        if "latchkey" in rates and rates.get("peer", {}).get("tokens_per_second"):
            ratio = rates["latchkey"]["tokens_per_second"] / rates["peer"]["tokens_per_second"]
            print(f"latchkey / peer tokens/s: {ratio:.2f}")
        else:
            print("latchkey / peer tokens/s: n/a (a throughput stage did not run)")
        print(f"total {total} s; results in {out}")
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]) or 0)
