/* Heartbeat probe layout shared by the XDP responder (xdp.bpf.c), the userspace responder and the prober
 * (src/probe.rs mirrors it; sizes are checked at compile time there). All multi-byte fields are in network
 * byte order: the packet crosses machines. */
#ifndef VIGIL_PROBE_H
#define VIGIL_PROBE_H

#define VIGIL_PROBE_MAGIC 0x56474842u /* "VGHB" */
#define VIGIL_PROBE_VERSION 1

#define VIGIL_PROBE_REQUEST    1 /* parent -> child node */
#define VIGIL_PROBE_REPLY_XDP  2 /* answered by the node's kernel (XDP) */
#define VIGIL_PROBE_REPLY_USER 3 /* answered by the broker's userspace responder thread */

/* reply flags */
#define VIGIL_PROBE_ALIVE   (1u << 0) /* the broker process is alive */
#define VIGIL_PROBE_UNKNOWN (1u << 1) /* no broker registered on this port */

struct vigil_probe {
	__u32 magic;
	__u8 version;
	__u8 type;       /* VIGIL_PROBE_* */
	__u16 flags;     /* reply flags */
	__u32 seq;       /* echoed */
	__u32 rank;      /* echoed (prober's id of the child) */
	__u64 sent_ns;   /* prober's clock, echoed */
	__u64 hb_age_ns; /* reply: ns since the broker last wrote its userspace heartbeat */
	__u64 answered;  /* reply: probes answered for this broker so far */
};

/* Per-broker state, key = UDP port of its probe socket (network byte order, __u16 widened to __u32). */
struct vigil_hb_state {
	__u64 hb_ns;    /* CLOCK_MONOTONIC ns of the broker's last userspace heartbeat */
	__u64 answered; /* probes answered (XDP) */
	__u32 pid;      /* broker tgid */
	__u32 alive;    /* 1 while the broker runs; cleared when its exit is seen */
};

#endif
