"""A TCP and UDP echo of one word, standing for a service a sandbox must not reach.

    python3 listener.py [--bind ADDRESS] NAME PORT...

Answers every TCP connection and every UDP datagram on each PORT with "pong NAME", so a probe
knows which listener it reached. Prints "ready" once every socket is bound. Standard library only:
it runs on the node, inside a network namespace the test makes, and in the sandbox image.
"""

import socket
import sys
import threading


def serve_tcp(sock, reply):
    while True:
        conn, _ = sock.accept()
        with conn:
            conn.settimeout(2)
            try:
                conn.recv(64)
                conn.sendall(reply)
            except OSError:
                pass


def serve_udp(sock, reply):
    while True:
        _, peer = sock.recvfrom(64)
        sock.sendto(reply, peer)


def main(argv):
    bind = "0.0.0.0"
    if argv[:1] == ["--bind"]:
        bind, argv = argv[1], argv[2:]
    name, ports = argv[0], [int(p) for p in argv[1:]]
    reply = f"pong {name}\n".encode()
    threads = []
    for port in ports:
        tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        tcp.bind((bind, port))
        tcp.listen(16)
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.bind((bind, port))
        threads += [threading.Thread(target=serve_tcp, args=(tcp, reply), daemon=True),
                    threading.Thread(target=serve_udp, args=(udp, reply), daemon=True)]
    for t in threads:
        t.start()
    print("ready", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main(sys.argv[1:])
