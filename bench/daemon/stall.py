#!/usr/bin/env python3
"""bench/daemon/stall.py - how long one client's long prompts hold up the others.

For each dgemmad binary given, in turn: start it on MODEL (a private socket,
max_line_bytes 4 MiB), have one connection send PROMPTS generate requests of
1 MB of text each (max_tokens 1), one after the other, while a second
connection sends status requests back to back; print the status round
trips' median, 99th percentile and maximum.  A front end that tokenizes on
its own thread stalls every other connection for the whole tokenization.

usage: bench/daemon/stall.py MODEL LABEL=DGEMMAD [LABEL=DGEMMAD ...] [--prompts N]
Not a test: it prints a table and asserts nothing.
"""
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time


def one(binary, model, prompts):
    """(status round trips in ms, sorted) for one daemon binary."""
    d = tempfile.mkdtemp(prefix="dgemma-stall-")
    sock = os.path.join(d, "d.sock")
    cmd = [binary, "-o", "model=" + model, "-o", "socket=" + sock,
           "-o", "log_file=" + os.path.join(d, "d.log"), "-o", "max_line_bytes=4194304",
           "-o", "pin_workers=false"]
    if os.geteuid() == 0:
        cmd += ["-o", "allow_root=true"]
    p = subprocess.Popen(cmd)
    try:
        b = None
        for _ in range(600):
            try:
                b = socket.socket(socket.AF_UNIX)
                b.connect(sock)
                break
            except OSError:
                b.close()
                b = None
                time.sleep(0.05)
        if b is None:
            raise SystemExit("%s did not come up (log in %s)" % (binary, d))
        words = ["alpha ", "beta ", "gamma ", "the ", "quick ", "fox ", "12345 ", "hello "]
        text = "".join(words[(i * 7 + i // 5) % 8] for i in range(170000))[:1000000]
        line = (json.dumps({"v": 1, "op": "generate", "prompt": text, "max_tokens": 1,
                            "stream": False}) + "\n").encode()
        done = threading.Event()

        def sender():
            a = socket.socket(socket.AF_UNIX)
            a.connect(sock)
            f = a.makefile("rb")
            for _ in range(prompts):
                a.sendall(line)
                f.readline()  # (accepted or error; a done may follow, unread)
            done.set()
            a.close()

        t = threading.Thread(target=sender)
        bf = b.makefile("rb")
        lat = []
        t.start()
        while not done.is_set():
            t0 = time.perf_counter()
            b.sendall(b'{"v":1,"op":"status"}\n')
            bf.readline()
            lat.append((time.perf_counter() - t0) * 1e3)
        t.join()
        b.close()
        return sorted(lat)
    finally:
        p.terminate()
        p.wait()


def main(argv):
    prompts = 8
    if "--prompts" in argv:
        i = argv.index("--prompts")
        prompts = int(argv[i + 1])
        del argv[i:i + 2]
    if len(argv) < 2 or any("=" not in x for x in argv[1:]):
        raise SystemExit(__doc__)
    model = argv[0]
    print("| dgemmad | status requests | median ms | p99 ms | max ms |")
    print("|---|---:|---:|---:|---:|")
    for arg in argv[1:]:
        label, binary = arg.split("=", 1)
        lat = one(binary, model, prompts)
        print("| %s | %d | %.2f | %.2f | %.1f |" % (label, len(lat), lat[len(lat) // 2],
                                                   lat[min(len(lat) - 1, int(len(lat) * 0.99))],
                                                   lat[-1]))


if __name__ == "__main__":
    main(sys.argv[1:])
