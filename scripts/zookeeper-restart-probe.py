#!/usr/bin/env python3
"""Restarts a local ZooKeeper (Debian's zookeeper package) and reports how the first
connections made while it starts are answered.

Each round: start a standalone server, open a session, kill the server (SIGKILL), start it
again, and from then on connect every 10 ms and send the session's ConnectRequest,
waiting up to 6 s for an answer. A connection the server accepts while it starts is
either closed ("eof": not serving yet) or answered; the rounds where one got no answer
at all ("noanswer") show the case lease-zookeeper's session resumption must not wait on.

Usage: python3 scripts/zookeeper-restart-probe.py [ROUNDS]
"""
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time

CLASSPATH = "/etc/zookeeper/conf:/usr/share/java/zookeeper.jar"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def connect_request(session, password, timeout_ms=20000):
    body = struct.pack(">iqiq", 0, 0, timeout_ms, session)
    body += struct.pack(">i", len(password)) + password + b"\0"
    return struct.pack(">i", len(body)) + body


def try_once(port, session, password, wait):
    s = socket.socket()
    s.settimeout(wait)
    try:
        s.connect(("127.0.0.1", port))
    except (ConnectionRefusedError, socket.timeout):
        s.close()
        return "refused", 0.0, b""
    start = time.monotonic()
    s.sendall(connect_request(session, password))
    try:
        data = s.recv(4096)
    except socket.timeout:
        return "noanswer", time.monotonic() - start, b""
    except ConnectionResetError:
        return "reset", time.monotonic() - start, b""
    finally:
        s.close()
    return ("answer" if data else "eof"), time.monotonic() - start, data


def round_(workdir):
    port = free_port()
    data = os.path.join(workdir, "data")
    shutil.rmtree(data, ignore_errors=True)
    os.makedirs(data)
    cfg = os.path.join(workdir, "zoo.cfg")
    with open(cfg, "w") as f:
        f.write(
            f"tickTime=200\ndataDir={data}\nclientPort={port}\n"
            "clientPortAddress=127.0.0.1\nadmin.enableServer=false\n"
            "maxSessionTimeout=600000\n"
        )
    log = open(os.path.join(workdir, "server.log"), "ab")
    args = ["java", "-cp", CLASSPATH, "-Xmx256m", f"-Dzookeeper.log.dir={workdir}",
            "org.apache.zookeeper.server.quorum.QuorumPeerMain", cfg]
    server = subprocess.Popen(args, stdout=log, stderr=log)
    try:
        while True:
            kind, _, reply = try_once(port, 0, b"\0" * 16, 5)
            if kind == "answer":
                break
            time.sleep(0.05)
        _, _, _, session, plen = struct.unpack(">iiiqi", reply[:24])
        password = reply[24:24 + plen]
        server.kill()
        server.wait()
        server = subprocess.Popen(args, stdout=log, stderr=log)
        started = time.monotonic()
        seen = []
        while time.monotonic() - started < 15:
            at = time.monotonic() - started
            kind, took, _ = try_once(port, session, password, 6)
            if kind != "refused":
                seen.append((round(at, 3), kind, round(took, 3)))
            if kind == "answer":
                break
            time.sleep(0.01)
        return seen
    finally:
        server.kill()
        server.wait()


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    unanswered = 0
    with tempfile.TemporaryDirectory(prefix="zk-restart-probe-") as workdir:
        for i in range(rounds):
            seen = round_(workdir)
            hung = [s for s in seen if s[1] == "noanswer"]
            unanswered += bool(hung)
            shown = seen[:1] + [s for s in hung if s is not seen[0]]
            summary = ", ".join(f"{k} after {t}s (made {at}s after the start)" for at, k, t in shown)
            print(f"round {i + 1}: {len(seen)} connections until answered; {summary}")
    print(f"{unanswered} of {rounds} restarts left a connection unanswered")


if __name__ == "__main__":
    main()
