#!/usr/bin/env python3
"""A FUSE file system that answers INIT and never anything else, mounted in a mount namespace of its own.

Usage (root): stuckfs.py MOUNTPOINT. Prints "ready PID" once mounted. An access to MOUNTPOINT from that namespace
(e.g. `stat /proc/PID/root/MOUNTPOINT`) is read by this daemon and never answered. The caller sleeps, and once it
gets SIGKILL it sleeps uninterruptibly (state D in /proc/PID/stat): the kernel waits out a request the daemon
has read. It ends when this daemon exits: /dev/fuse closes, the connection is aborted and the caller's request
fails. Nothing outside the namespace sees the mount (a `df` elsewhere does not hang on it).

No FUSE library: the mount is mount(2) with `fd=N`, and the only reply is to FUSE_INIT (protocol 7.22's 24-byte
fuse_init_out, which the kernel accepts from a daemon of that minor version).
"""
import ctypes, os, struct, sys

CLONE_NEWNS = 0x00020000
MS_REC, MS_PRIVATE = 0x4000, 0x40000
libc = ctypes.CDLL(None, use_errno=True)

def check(rc, what):
    if rc != 0:
        e = ctypes.get_errno()
        sys.exit(f"stuckfs: {what}: {os.strerror(e)}")

mnt = sys.argv[1]
check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
fd = os.open("/dev/fuse", os.O_RDWR)
opts = f"fd={fd},rootmode=40000,user_id=0,group_id=0".encode()
check(libc.mount(b"stuckfs", mnt.encode(), b"fuse.stuckfs", 0, opts), f"mount fuse on {mnt}")
print(f"ready {os.getpid()}", flush=True)
FUSE_INIT = 26
while True:
    try:
        req = os.read(fd, 1 << 20)
    except OSError:
        break
    length, opcode, unique = struct.unpack_from("<IIQ", req)
    if opcode == FUSE_INIT:
        major, minor = struct.unpack_from("<II", req, 40)
        # fuse_init_out as of protocol 7.22 (24 bytes): major, minor, max_readahead, flags, max_background,
        # congestion_threshold, max_write.
        body = struct.pack("<IIIIHHI", 7, 22, 0, 0, 0, 0, 4096)
        os.write(fd, struct.pack("<IiQ", 16 + len(body), 0, unique) + body)
    # Anything else: read, never answered.
