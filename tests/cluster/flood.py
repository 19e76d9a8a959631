# tests/cluster/flood.py HOST PORT SECONDS - a stranger (no cluster key)
# flooding a node's cluster port with connections that send nothing: it
# holds up to 200 open, reopening those the node closes, and stops by itself
# after SECONDS or 20000 connections.  Run inside a test namespace only.
import socket
import sys
import time

host, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
socks, made, end = [], 0, time.time() + seconds
while time.time() < end and made < 20000:
    alive = []
    for s in socks:
        try:
            if s.recv(4096, socket.MSG_DONTWAIT) == b"":
                s.close()
                continue
        except BlockingIOError:
            pass
        except OSError:
            s.close()
            continue
        alive.append(s)
    socks = alive
    while len(socks) < 200 and made < 20000:
        s = socket.socket()
        s.settimeout(1)
        try:
            s.connect((host, port))
            socks.append(s)
        except OSError:
            s.close()
        made += 1
    time.sleep(0.1)
print("connections opened:", made)
