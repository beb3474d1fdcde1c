#!/usr/bin/env python3
"""test_recovery.py - a fleet that survives a failed stage (`run --standby`): the coordinator
keeps every token, so when a worker dies (kill -9) or stalls (SIGSTOP) mid-generation it
reconnects with a standby worker (started with --cache: it is sent the lost stage's shard) in
its place, replays the sequence, and goes on; the output equals, token for token, the run
nobody disturbed. On 2 and 3 stages, greedy and seeded sampling, kills at random moments
(--stats counts the failures and recoveries); a stall recovers after --stage-timeout-ms;
without a standby, or when the standby is gone too, the run ends with the failure's clear
error. Exit 0 pass, 1 fail.
"""
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from psserve import Server  # noqa: E402
from pstest import failures, require  # noqa: E402
from psworker import Worker  # noqa: E402

BIN = os.environ.get("PIPESHARD_BIN", "")
TRIALS = 6  # kills per (stage count, sampling): 24 in all


def run(fleet, key, args, timeout=120):
    return subprocess.run([BIN, "run", "--fleet", fleet, "--key-file", key, "--prompt-ids", "1,2,3", "-n", "400",
                           "--ignore-eos", "--print-ids", "-t", "1", "--sim-latency-ms", "1", "--stats"] + args,
                          capture_output=True, text=True, timeout=timeout)


def stats_of(p):
    for line in reversed(p.stderr.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {}


class Fleet:
    """Workers for stages 1.. of a split (fresh ones, with fleet.json pointing at them) and a
    standby worker with a cache of its own."""

    def __init__(self, tmp, split_dir, key, n, tag, standby=True):
        self.workers, self.n = [], n
        with open(os.path.join(split_dir, "fleet.json")) as f:
            fleet = json.load(f)
        for k in range(1, n):
            w = Worker(BIN, os.path.join(split_dir, f"stage-{k}.gguf"), os.path.join(tmp, f"{tag}-w{k}.log"),
                       f"stage {k}", key=key)
            fleet["stages"][k]["address"] = w.addr
            self.workers.append(w)
        self.standby = Worker(BIN, None, os.path.join(tmp, f"{tag}-sb.log"), "standby", key=key,
                              cache=os.path.join(tmp, f"{tag}-cache")) if standby else None
        self.path = os.path.join(split_dir, f"fleet-{tag}.json")
        for k, st in enumerate(fleet["stages"]):
            st["shard"] = os.path.join(split_dir, f"stage-{k}.gguf")
        with open(self.path, "w") as f:
            json.dump(fleet, f)

    def stop(self):
        for w in self.workers + ([self.standby] if self.standby else []):
            w.stop()


def main():
    if not BIN or not os.access(BIN, os.X_OK):
        print("PIPESHARD_BIN is not set (run through ctest)")
        return 1
    tmp = tempfile.mkdtemp(prefix="recovery_", dir=os.environ.get("PS_TEST_TMP") or None)
    model = os.path.join(tmp, "m.gguf")
    p = subprocess.run([BIN, "synth", "--like", "tiny", "--layers", "4", "--type", "Q8_0", "-o", model],
                       capture_output=True, text=True)
    require(p.returncode == 0, f"synth: {p.stderr}")
    key = os.path.join(tmp, "key")
    subprocess.run([BIN, "keygen", "-o", key], capture_output=True, check=True)
    rng = random.Random(3)
    for n in (2, 3):
        split = os.path.join(tmp, f"split{n}")
        p = subprocess.run([BIN, "split", "-m", model, "--stages", str(n), "-o", split, "--quiet"],
                           capture_output=True, text=True)
        require(p.returncode == 0, f"split: {p.stderr}")
        for mode, args in (("greedy", ["--temp", "0"]), ("seeded", ["--temp", "0.9", "--seed", "11"])):
            f = Fleet(tmp, split, key, n, f"{n}-{mode}-ref", standby=False)
            t0 = time.time()
            ref = run(f.path, key, args)
            took = time.time() - t0
            f.stop()
            require(ref.returncode == 0 and len(ref.stdout.split()) == 400, f"the undisturbed run: {ref.stderr}")
            recovered = 0
            for trial in range(TRIALS):
                f = Fleet(tmp, split, key, n, f"{n}-{mode}-{trial}")
                victim = rng.choice(f.workers)
                at = rng.uniform(0.1, 0.8) * took
                threading.Timer(at, lambda w=victim: w.p.send_signal(signal.SIGKILL)).start()
                p = run(f.path, key, args + ["--standby", f.standby.addr])
                f.stop()
                st = stats_of(p)
                require(p.returncode == 0, f"{n} stages, {mode}, kill at {at:.2f} s: exit {p.returncode}: {p.stderr[-600:]}")
                require(p.stdout == ref.stdout, f"{n} stages, {mode}, kill at {at:.2f} s: the output differs")
                if st.get("recoveries"):  # --stats names where each stage runs now
                    require(f.standby.addr in [s["address"] for s in st["stage_stats"]],
                            f"--stats after the standby took over: {st['stage_stats']}")
                recovered += st.get("recoveries", 0)
            require(recovered >= TRIALS // 2, f"{n} stages, {mode}: only {recovered} of {TRIALS} kills landed mid-run")
            print(f"  ok: {n} stages, {mode}: {TRIALS} kills at random moments, {recovered} recovered mid-run, "
                  f"every output the undisturbed one")

    # a stall (SIGSTOP): found after --stage-timeout-ms, the standby takes the stage's place
    split = os.path.join(tmp, "split2")
    f = Fleet(tmp, split, key, 2, "ref-stall", standby=False)
    ref = run(f.path, key, ["--temp", "0"])
    f.stop()
    f = Fleet(tmp, split, key, 2, "stall")
    threading.Timer(0.3, lambda: f.workers[0].p.send_signal(signal.SIGSTOP)).start()
    p = run(f.path, key, ["--temp", "0", "--standby", f.standby.addr, "--stage-timeout-ms", "1500"])
    f.stop()
    st = stats_of(p)
    require(p.returncode == 0 and p.stdout == ref.stdout and st.get("recoveries") == 1,
            f"a stalled stage: exit {p.returncode}, stats {st}, {p.stderr[-400:]}")
    print(f"  ok: a stalled stage recovered in {st.get('recovery_ms', 0):.0f} ms, the output the undisturbed one")

    # serve: 16 streams in flight and a worker killed: all 16 complete, each its undisturbed answer
    # (seeded sampling's replay is run's above; the scheduler's own replay is what is new here)
    def streams(fleet_path, extra, kill=None):
        with Server(["--fleet", fleet_path, "--key-file", key, "-t", "1", "--parallel", "16", "--sim-latency-ms", "1"]
                    + extra, f"serve-{len(extra)}", tmp) as srv:
            out, threads = [None] * 16, []

            def one(i):
                # greedy: a random model's end-of-text token comes up far less often than when sampling
                body = {"prompt": f"Once upon a time {i}", "max_tokens": 400, "temperature": 0}
                st, _, text = srv.request("POST", "/v1/completions", body)
                out[i] = (st, json.loads(text)["choices"][0]["text"] if st == 200 else text)

            for i in range(16):
                threads.append(threading.Thread(target=one, args=(i,)))
                threads[-1].start()
            if kill:  # while the streams run
                srv.wait_metric("pipeshard_running_sequences", lambda v: v >= 8)
                kill.p.send_signal(signal.SIGKILL)
            for t in threads:
                t.join()
            m = srv.metrics()
            return out, m

    f = Fleet(tmp, split, key, 2, "serve-ref", standby=False)
    ref, _ = streams(f.path, [])
    f.stop()
    require(all(st == 200 for st, _ in ref), f"serve, undisturbed: {ref}")
    require(sum(len(t) for _, t in ref) > 16 * 200, f"serve: the answers are too short to be killed in: {ref}")
    f = Fleet(tmp, split, key, 2, "serve-kill")
    got, m = streams(f.path, ["--standby", f.standby.addr], kill=f.workers[0])
    f.stop()
    require(got == ref, f"serve: after a worker was killed, the answers differ: {got[:2]} vs {ref[:2]}")
    require(m.get("pipeshard_fleet_recoveries_total", 0) >= 1,
            f"serve: failures {m.get('pipeshard_fleet_failures_total')}, recoveries "
            f"{m.get('pipeshard_fleet_recoveries_total')}")
    print(f"  ok: serve: 16 streams, a worker killed: all 16 answers the undisturbed ones "
          f"({m.get('pipeshard_fleet_failures_total')} failure, {m.get('pipeshard_fleet_recoveries_total')} recovery)")

    # no standby, or a standby that is gone too: the failure's clear error
    for tag, standby in (("none", None), ("gone", "127.0.0.1:9")):
        f = Fleet(tmp, split, key, 2, f"err-{tag}", standby=False)
        threading.Timer(0.3, lambda: f.workers[0].p.send_signal(signal.SIGKILL)).start()
        p = run(f.path, key, ["--temp", "0"] + (["--standby", standby] if standby else []))
        f.stop()
        first = (p.stderr.strip().splitlines() or [""])[-1]
        require(p.returncode == 1 and "stage 1" in first and "did the worker stop?" in first
                and ("recovering failed" in first) == (standby is not None), f"{tag}: exit {p.returncode}, {first!r}")
        print(f"  ok: {tag}: {first}")
    return 1 if failures() else 0


if __name__ == "__main__":
    sys.exit(main())
