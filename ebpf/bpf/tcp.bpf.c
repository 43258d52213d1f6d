// SPDX-License-Identifier: GPL-2.0
/* Vigil TCP connection failure detector (IPv4).
 *
 * Watches a set of local-perspective 4-tuples (saddr, sport, daddr, dport)
 * and reports resets received, close transitions and retransmits.
 * Key layout: addresses in network byte order, ports in host byte order
 * (that is how the tracepoints record them).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include "events.h"
#include "output.h"

char LICENSE[] SEC("license") = "GPL";

#define VIGIL_AF_INET 2
#define VIGIL_IPPROTO_TCP 6
/* include/net/tcp_states.h */
#define TCPS_FIN_WAIT1 4
#define TCPS_CLOSE 7
#define TCPS_CLOSE_WAIT 8

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct vigil_tcp_key);
	__type(value, __u8);
} WATCHED_TCP SEC(".maps");

VIGIL_EVENTS_MAP(TCP_EVENTS);

static __always_inline void make_key(struct vigil_tcp_key *k, const __u8 *saddr, const __u8 *daddr,
				     __u16 sport, __u16 dport)
{
	/* The address arrays live in the tracepoint record (ctx). With CO-RE the
	 * array base is computed as ctx+off, and the verifier rejects loads via
	 * a modified ctx pointer, so copy them with a helper instead. */
	bpf_probe_read_kernel(&k->saddr, 4, saddr);
	bpf_probe_read_kernel(&k->daddr, 4, daddr);
	k->sport = sport;
	k->dport = dport;
}

static __always_inline void emit(void *ctx, const struct vigil_tcp_key *k, __u32 kind, int oldstate, int newstate)
{
	struct vigil_tcp_event e;
	__builtin_memset(&e, 0, sizeof(e));
	e.ktime_ns = bpf_ktime_get_ns();
	e.key = *k;
	e.kind = kind;
	e.oldstate = oldstate;
	e.newstate = newstate;
	e.pid = bpf_get_current_pid_tgid() >> 32;
	vigil_output(ctx, &TCP_EVENTS, &e);
}

SEC("tracepoint/sock/inet_sock_set_state")
int vigil_inet_sock_set_state(struct trace_event_raw_inet_sock_set_state *ctx)
{
	if (ctx->protocol != VIGIL_IPPROTO_TCP || ctx->family != VIGIL_AF_INET)
		return 0;
	int newstate = ctx->newstate;
	if (newstate != TCPS_CLOSE && newstate != TCPS_CLOSE_WAIT &&
	    newstate != TCPS_FIN_WAIT1)
		return 0;
	struct vigil_tcp_key k = {};
	make_key(&k, ctx->saddr, ctx->daddr, ctx->sport, ctx->dport);
	if (!bpf_map_lookup_elem(&WATCHED_TCP, &k))
		return 0;
	emit(ctx, &k, VIGIL_TCP_CLOSE, ctx->oldstate, newstate);
	if (newstate == TCPS_CLOSE)
		bpf_map_delete_elem(&WATCHED_TCP, &k); /* connection is gone: drop the watch */
	return 0;
}

/* tcp_retransmit_skb's record before it became an event of its own (Linux 6.17 added `err` and the type
 * trace_event_raw_tcp_retransmit_skb): an event of the class tcp_event_sk_skb, shared with tcp_send_reset. The
 * fields read here have the same names and types in both; CO-RE matches this type to the kernel's
 * trace_event_raw_tcp_event_sk_skb (the ___ suffix is ignored), so their offsets come from the running kernel. */
struct trace_event_raw_tcp_event_sk_skb___vigil {
	const void *skaddr;
	int state;
	__u16 sport;
	__u16 dport;
	__u16 family;
	__u8 saddr[4];
	__u8 daddr[4];
} __attribute__((preserve_access_index));

/* The socket's family, from the record where it has the field (Linux 5.12 added `family` to the tcp records),
 * else from the socket the record points to (4.15-5.11). Only one branch survives the relocation. */
#define VIGIL_FAMILY(rec)                                                                                      \
	(bpf_core_field_exists((rec)->family) ? (int)(rec)->family                                             \
					       : (int)BPF_CORE_READ((struct sock *)(rec)->skaddr, __sk_common.skc_family))

/* The socket's TCP state, from the retransmit record where it has the field (added after 4.19), else from the
 * socket. */
#define VIGIL_STATE(rec)                                                                                       \
	(bpf_core_field_exists((rec)->state) ? (int)(rec)->state                                               \
					      : (int)BPF_CORE_READ((struct sock *)(rec)->skaddr, __sk_common.skc_state))

/* One body for both record types (a macro: the two are distinct C types). */
#define VIGIL_RETRANSMIT(rec)                                                                                  \
	do {                                                                                                   \
		if (VIGIL_FAMILY(rec) != VIGIL_AF_INET)                                                        \
			return 0;                                                                              \
		struct vigil_tcp_key k = {};                                                                   \
		make_key(&k, (rec)->saddr, (rec)->daddr, (rec)->sport, (rec)->dport);                          \
		if (!bpf_map_lookup_elem(&WATCHED_TCP, &k))                                                    \
			return 0;                                                                              \
		emit(ctx, &k, VIGIL_TCP_RETRANSMIT, -1, VIGIL_STATE(rec));                                          \
	} while (0)

SEC("tracepoint/tcp/tcp_retransmit_skb")
int vigil_tcp_retransmit_skb(void *ctx)
{
	/* Exactly one branch survives the relocation to a constant; the verifier never walks the other, whose
	 * field reads the loader could not relocate on this kernel. */
	if (bpf_core_type_exists(struct trace_event_raw_tcp_retransmit_skb)) {
		struct trace_event_raw_tcp_retransmit_skb *rec = ctx;
		VIGIL_RETRANSMIT(rec);
	} else {
		struct trace_event_raw_tcp_event_sk_skb___vigil *rec = ctx;
		VIGIL_RETRANSMIT(rec);
	}
	return 0;
}

SEC("tracepoint/tcp/tcp_receive_reset")
int vigil_tcp_receive_reset(struct trace_event_raw_tcp_event_sk *ctx)
{
	if (VIGIL_FAMILY(ctx) != VIGIL_AF_INET)
		return 0;
	struct vigil_tcp_key k = {};
	make_key(&k, ctx->saddr, ctx->daddr, ctx->sport, ctx->dport);
	if (!bpf_map_lookup_elem(&WATCHED_TCP, &k))
		return 0;
	emit(ctx, &k, VIGIL_TCP_RESET, -1, -1);
	return 0;
}
