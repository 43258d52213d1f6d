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
#define VIGIL_PROBE_GROUP      4 /* parent -> every child node at once (IP multicast); answered by the kernels of
                                  * the nodes that learned this parent from an earlier unicast request */

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

/* Child side: a parent learned from a unicast request, so that its group (multicast) requests can be answered.
 * Key: the parent prober's IPv4 address and UDP port (network byte order). */
struct vigil_parent_key {
	__u32 addr;
	__u32 port; /* __u16 widened */
};

struct vigil_parent {
	__u32 rank;      /* the parent's id for this child, echoed in replies */
	__u32 addr;      /* the child's own IPv4 address (destination of the unicast request) */
	__u16 port;      /* the child broker's probe port (destination port of the unicast request) */
	__u8 mac[6];     /* the child's own MAC (destination MAC of the unicast request) */
};

/* Parent side: where the kernel collects the replies of one child, so the prober reads them from shared memory
 * (the array is mmapped) instead of receiving every datagram on its socket. Index: a slot the prober chose
 * and put in its requests' `rank` field, which unicast and group replies echo. A prober owns whole blocks of
 * VIGIL_SLOT_BLOCK slots, claimed in SLOT_CLAIMS. */
#define VIGIL_SLOTS 65536
#define VIGIL_SLOT_BLOCK 64

struct vigil_result {
	__u32 expect_addr; /* written by the prober: replies from any other address/port, or to another prober */
	__u16 expect_port; /*   port, are not collected (network byte order) */
	__u16 prober_port;
	__u32 seq;         /* last reply's fields, host byte order; seq written last */
	__u16 flags;
	__u8 kind;         /* VIGIL_PROBE_REPLY_* of the last reply, 0 if none yet */
	__u8 pad;
	__u64 sent_ns;
	__u64 hb_age_ns;
	__u64 answered;
	__u64 replies;     /* replies collected in this slot */
};

/* Owner of a block of slots (key: block number). */
struct vigil_slot_claim {
	__u32 pid;
	__u32 port; /* prober's UDP port, host byte order */
};

#endif
