#!/usr/bin/env python3
"""rogue_mdns.py - a hostile host for tests/cluster/run.sh: a multicast DNS
responder that lies about the racimo service, and a TCP listener on the
cluster port that speaks no racimo.  It holds no cluster key; it knows what
anyone on the LAN can hear (the fingerprint, the node ids).

Every second for SECONDS it multicasts, from its own address OWN:
  - the id of a known node (VICTIM) at SPOOF_ADDR (default a dead address,
    10.77.0.99), under the real node's own host name, with an escape
    sequence in the instance name;
  - N_FAKE made-up nodes of this cluster, half at OWN (where the listener
    fails their handshakes), half at the dead address;
  - a node (id ee..) sent with IP TTL 64, as if routed in;
  - nodes whose A record is a loopback (id dd..) or the subnet's broadcast
    address (id cc..).
It prints a line for each TCP connection the listener accepts, and at the end
writes their number to OUT.

usage: rogue_mdns.py FP VICTIM_ID OWN SECONDS N_FAKE OUT [SPOOF_ADDR]
"""
import os
import socket
import struct
import sys
import threading
import time

GROUP, PORT = "224.0.0.251", 5353
SERVICE = "_racimo._tcp.local"
DEAD = "10.77.0.99"


def name(n):
    out = b""
    labels, cur, i = [], b"", 0
    raw = n.encode()
    while i < len(raw):           # split at dots that are not escaped
        c = raw[i:i + 1]
        if c == b"\\" and i + 1 < len(raw):
            cur += raw[i + 1:i + 2]
            i += 2
            continue
        if c == b".":
            labels.append(cur)
            cur = b""
        else:
            cur += c
        i += 1
    labels.append(cur)
    for l in labels:
        out += bytes([len(l)]) + l
    return out + b"\0"


def rr(n, rtype, rdata, ttl=120, flush=True):
    klass = 1 | (0x8000 if flush else 0)
    return name(n) + struct.pack(">HHIH", rtype, klass, ttl, len(rdata)) + rdata


def instance(label, node_id, fp, host, addr, port=7719):
    inst = label.replace(".", "\\.") + "." + SERVICE
    txt = b"".join(bytes([len(s)]) + s for s in
                   [b"txtvers=1", b"proto=1.3", ("id=" + node_id).encode(), ("fp=" + fp).encode()])
    return [rr(SERVICE, 12, name(inst), 4500, False),
            rr(inst, 33, struct.pack(">HHH", 0, 0, port) + name(host)),
            rr(inst, 16, txt, 4500),
            rr(host, 1, socket.inet_aton(addr))]


def packet(records):
    return struct.pack(">HHHHHH", 0, 0x8400, 0, len(records), 0, 0) + b"".join(records)


def listener(own, counter, stop):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((own, 7719))
    s.listen(64)
    s.settimeout(0.2)
    while not stop.is_set():
        try:
            c, peer = s.accept()
        except socket.timeout:
            continue
        counter[0] += 1
        print("accepted a connection from %s" % peer[0], flush=True)
        try:
            c.sendall(os.urandom(92))     # a HELLO's worth of noise
        except OSError:
            pass
        c.close()
    s.close()


def main():
    fp, victim, own, seconds, n_fake, out = sys.argv[1:7]
    spoof_addr = sys.argv[7] if len(sys.argv) > 7 else DEAD
    seconds, n_fake = int(seconds), int(n_fake)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    tx.bind((own, PORT))
    tx.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(own))
    counter, stop = [0], threading.Event()
    t = threading.Thread(target=listener, args=(own, counter, stop))
    t.start()
    fakes = []
    for i in range(n_fake):
        fid = "f%07x" % i + os.urandom(12).hex()
        fakes += instance("fake %d [%s]" % (i, fid[:8]), fid, fp, "fake%d.local" % i,
                          own if i % 2 else DEAD)
    spoof = instance("evil\x1b[31m\x1b]0;pwned\x07 [%s]" % victim[:8], victim, fp,
                     "racimo-%s.local" % victim[:16], spoof_addr)
    loop = instance("loop [dddddddd]", "dd" * 16, fp, "loop.local", "127.0.0.1")
    bcast = instance("bcast [cccccccc]", "cc" * 16, fp, "bcast.local", "10.77.0.255")
    routed = instance("routed [eeeeeeee]", "ee" * 16, fp, "routed.local", own)
    end = time.time() + seconds
    while time.time() < end:
        tx.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 255)
        for recs in [spoof, loop, bcast]:
            tx.sendto(packet(recs), (GROUP, PORT))
        for i in range(0, len(fakes), 16):     # 4 instances a packet: under the MTU
            tx.sendto(packet(fakes[i:i + 16]), (GROUP, PORT))
        tx.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 64)
        tx.sendto(packet(routed), (GROUP, PORT))
        time.sleep(1)
    stop.set()
    t.join()
    with open(out, "w") as f:
        f.write("%d\n" % counter[0])


if __name__ == "__main__":
    main()
