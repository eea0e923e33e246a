"""Tries to reach each target over TCP or UDP and prints what answered, one JSON line each.

    python3 probe.py NAME PROTO IP PORT MODE [NAME PROTO IP PORT MODE ...]

MODE "pong": reached only when the listener answered ("pong ..."): a refused connection, a
timeout or an ICMP error are all "not reached", and the line says which. MODE "connect": a TCP
connection is enough (the API server, which does not answer "pong"). Targets are tried side by
side, each within two seconds. Standard library only (it runs inside sandbox Pods); probe.sh is
the same for containers without Python.
"""

import json
import socket
import sys
import threading

TIMEOUT = 2.0


def probe(proto, ip, port, mode):
    kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
    try:
        with socket.socket(socket.AF_INET, kind) as sock:
            sock.settimeout(TIMEOUT)
            sock.connect((ip, int(port)))
            if mode == "connect":
                return True, "connected"
            sock.send(b"ping\n")
            answer = sock.recv(64).decode(errors="replace").strip()
            return answer.startswith("pong"), answer
    except OSError as err:
        return False, f"{type(err).__name__}: {err}"


def main(argv):
    lock = threading.Lock()

    def run(name, *target):
        reached, detail = probe(*target)
        with lock:
            print(json.dumps({"name": name, "reached": reached, "detail": detail}), flush=True)

    threads = [threading.Thread(target=run, args=argv[i:i + 5]) for i in range(0, len(argv) - 4, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


if __name__ == "__main__":
    main(sys.argv[1:])
