/* Shared event layouts between the BPF programs and vigil-ebpf (Rust).
 * Every change here must be mirrored in src/ (ExitEventRaw / TcpEventRaw);
 * the Rust side checks sizes with compile-time asserts. */
#ifndef VIGIL_EVENTS_H
#define VIGIL_EVENTS_H

#define VIGIL_COMM_LEN 16

/* exit_event.flags */
#define VIGIL_EXIT_OOM        (1u << 0) /* process was chosen by the OOM killer */
#define VIGIL_EXIT_HAS_SENDER (1u << 1) /* sender_pid / si_code are valid */

/* One record per exiting thread group (emitted by the group_dead thread). */
struct vigil_exit_event {
	__u64 ktime_ns;    /* bpf_ktime_get_ns() == CLOCK_MONOTONIC, ns */
	__u32 pid;         /* tgid, in the initial pid namespace */
	__u32 tid;         /* thread that finished the group */
	__u32 wait_status; /* raw wait(2)-style status: (code << 8) or signo | 0x80(core) */
	__u32 flags;       /* VIGIL_EXIT_* */
	__u32 sender_pid;  /* tgid that generated the fatal signal (if HAS_SENDER) */
	__s32 si_code;     /* si_code of that signal (SI_USER=0, SI_TKILL=-6, >0 kernel) */
	char comm[VIGIL_COMM_LEN];
};

/* TCP 4-tuple key, IPv4 only, all fields in network byte order. */
struct vigil_tcp_key {
	__u32 saddr;
	__u32 daddr;
	__u16 sport;
	__u16 dport;
};

#define VIGIL_TCP_RESET      1 /* tcp_receive_reset: peer sent RST */
#define VIGIL_TCP_CLOSE      2 /* inet_sock_set_state: -> TCP_CLOSE / FIN states */
#define VIGIL_TCP_RETRANSMIT 3 /* tcp_retransmit_skb */

struct vigil_tcp_event {
	__u64 ktime_ns;   /* CLOCK_MONOTONIC, ns */
	struct vigil_tcp_key key;
	__u32 kind;       /* VIGIL_TCP_* */
	__s32 oldstate;   /* TCP state before (close events), else -1 */
	__s32 newstate;   /* TCP state after (close events), else current state or -1 */
	__u32 pid;        /* tgid of current task when the event fired (often 0/softirq) */
};

#endif
