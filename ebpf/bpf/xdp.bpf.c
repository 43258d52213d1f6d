// SPDX-License-Identifier: GPL-2.0
/* Vigil heartbeat responder and reply collector (XDP).
 *
 * Answers a parent's UDP heartbeat probe in the kernel, for every broker registered in RESPONDERS (keyed by the
 * UDP port of the broker's probe socket): the reply says whether the broker is alive and how old its last
 * userspace heartbeat is. So a parent tells "node up, broker stalled for X ms" from "node gone" without
 * waiting on the child's userspace. Everything that is not a well-formed probe for a registered port is passed
 * to the stack untouched. IPv4, no IP options. The reply is sent back out of the interface it came in on
 * (XDP_TX) with the Ethernet/IP addresses and UDP ports swapped; the UDP checksum is set to 0 (none, legal
 * for IPv4) because the payload changed. No kernel structure is read, so no CO-RE relocation is needed.
 *
 * Group probes: a unicast request also teaches the node which parent (address, port) probes which broker
 * (PARENTS). A parent can then probe all its children with one IP multicast datagram per period; each child
 * node's kernel answers it with a unicast reply built from what it learned (its own address, MAC and port).
 *
 * Reply collection: on a parent's node, a reply whose slot (the `rank` field, chosen by the prober) is set up
 * in RESULTS for this prober's port and the address the reply comes from is recorded there and dropped. The
 * prober reads its children's replies from the mmapped array, no system call per period, and no datagram
 * reaches its socket. Replies nobody registered go up the stack as before. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "frame.h"

char LICENSE[] SEC("license") = "GPL";

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, struct vigil_hb_state);
} RESPONDERS SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct vigil_parent_key);
	__type(value, struct vigil_parent);
} PARENTS SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, VIGIL_SLOTS);
	__type(key, __u32);
	__type(value, struct vigil_result);
} RESULTS SEC(".maps");

/* Used by the probers only (atomic claims of slot blocks); here so it lives and is pinned with RESULTS. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, VIGIL_SLOTS / VIGIL_SLOT_BLOCK);
	__type(key, __u32);
	__type(value, struct vigil_slot_claim);
} SLOT_CLAIMS SEC(".maps");

/* The broker that loaded this object: its tgid and its key in RESPONDERS (set by userspace once it registered). */
struct vigil_owner {
	__u32 pid;
	__u32 key;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct vigil_owner);
} OWNER SEC(".maps");

/* The owner's main thread exits (killed, crashed: a clean exit leaves RESPONDERS first): from now on this node's
 * kernel answers its parent's probes with "broker dead", within a round trip, whether or not the FIN or reset of
 * its connections reaches the parent. Runs before the process's files are released, so while this program is
 * still attached. A classic tracepoint reading nothing but the current task's ids: loads on old kernels. */
SEC("tracepoint/sched/sched_process_exit")
int vigil_owner_exit(void *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 zero = 0;
	struct vigil_owner *o = bpf_map_lookup_elem(&OWNER, &zero);
	if (!o || o->pid == 0 || o->pid != (__u32)(id >> 32) || (__u32)id != (__u32)(id >> 32))
		return 0; /* another process, or a thread other than the main one */
	__u32 key = o->key;
	struct vigil_hb_state *st = bpf_map_lookup_elem(&RESPONDERS, &key);
	if (st && st->pid == o->pid)
		st->alive = 0;
	return 0;
}

static __always_inline __u64 htonll(__u64 v)
{
	return ((__u64)bpf_htonl((__u32)v) << 32) | bpf_htonl((__u32)(v >> 32));
}

static __always_inline __u16 ip_checksum(struct iphdr *ip)
{
	__u16 *w = (__u16 *)ip;
	__u32 sum = 0;
	ip->check = 0;
#pragma unroll
	for (int i = 0; i < 10; i++)
		sum += w[i];
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return ~sum;
}

/* Fill a reply in place from the broker's state. */
static __always_inline void fill_reply(struct vigil_probe *p, struct vigil_hb_state *st)
{
	__u64 now = bpf_ktime_get_ns();
	__u64 hb = st->hb_ns;
	__u64 answered = __sync_fetch_and_add(&st->answered, 1) + 1;
	p->type = VIGIL_PROBE_REPLY_XDP;
	p->flags = bpf_htons(st->alive ? VIGIL_PROBE_ALIVE : 0);
	p->hb_age_ns = htonll(now > hb ? now - hb : 0);
	p->answered = htonll(answered);
}

SEC("xdp")
int vigil_hb_responder(struct xdp_md *ctx)
{
	struct vigil_frame f;
	if (!vigil_frame_parse(ctx, &f))
		return XDP_PASS;
	struct ethhdr *eth = f.eth;
	struct iphdr *ip = f.ip;
	struct udphdr *udp = f.udp;
	struct vigil_probe *p = f.p;

	if (p->type == VIGIL_PROBE_REPLY_XDP || p->type == VIGIL_PROBE_REPLY_USER) {
		/* Parent side: collect a reply for a prober that asked for it. */
		__u32 slot = bpf_ntohl(p->rank);
		struct vigil_result *r = bpf_map_lookup_elem(&RESULTS, &slot);
		if (!r || r->expect_addr != ip->saddr || r->expect_port != udp->source || r->prober_port != udp->dest)
			return XDP_PASS;
		r->kind = p->type;
		r->flags = bpf_ntohs(p->flags);
		r->sent_ns = bpf_be64_to_cpu(p->sent_ns);
		r->hb_age_ns = bpf_be64_to_cpu(p->hb_age_ns);
		r->answered = bpf_be64_to_cpu(p->answered);
		__sync_fetch_and_add(&r->replies, 1);
		r->seq = bpf_ntohl(p->seq); /* last: the prober judges by seq */
		return XDP_DROP;
	}

	if (p->type == VIGIL_PROBE_GROUP) {
		/* One datagram for all the children of a parent: answer for the broker that parent probes here. */
		if ((ip->daddr & bpf_htonl(0xf0000000)) != bpf_htonl(0xe0000000))
			return XDP_PASS; /* group probes come by multicast only */
		struct vigil_parent_key pk = { .addr = ip->saddr, .port = udp->source };
		struct vigil_parent *par = bpf_map_lookup_elem(&PARENTS, &pk);
		if (!par)
			return XDP_DROP; /* another parent's children */
		__u32 key = par->port;
		struct vigil_hb_state *st = bpf_map_lookup_elem(&RESPONDERS, &key);
		if (!st)
			return XDP_DROP;
		fill_reply(p, st);
		p->rank = bpf_htonl(par->rank);
		__builtin_memcpy(eth->h_dest, eth->h_source, ETH_ALEN);
		__builtin_memcpy(eth->h_source, par->mac, ETH_ALEN);
		ip->daddr = ip->saddr;
		ip->saddr = par->addr;
		ip->ttl = 64;
		ip->check = ip_checksum(ip);
		udp->dest = udp->source;
		udp->source = par->port;
		udp->check = 0;
		return XDP_TX;
	}

	if (p->type != VIGIL_PROBE_REQUEST)
		return XDP_PASS;
	__u32 key = udp->dest;
	struct vigil_hb_state *st = bpf_map_lookup_elem(&RESPONDERS, &key);
	if (!st)
		return XDP_PASS; /* not ours: a userspace responder (or nobody) answers */

	/* Learn (or refresh) who probes this broker, for the parent's group probes. */
	struct vigil_parent_key pk = { .addr = ip->saddr, .port = udp->source };
	struct vigil_parent par = { .rank = bpf_ntohl(p->rank), .addr = ip->daddr, .port = udp->dest };
	__builtin_memcpy(par.mac, eth->h_dest, ETH_ALEN);
	struct vigil_parent *old = bpf_map_lookup_elem(&PARENTS, &pk);
	if (!old || old->rank != par.rank || old->addr != par.addr || old->port != par.port ||
	    *(__u32 *)old->mac != *(__u32 *)par.mac || *(__u16 *)&old->mac[4] != *(__u16 *)&par.mac[4])
		bpf_map_update_elem(&PARENTS, &pk, &par, BPF_ANY);

	fill_reply(p, st);

	unsigned char mac[ETH_ALEN];
	__builtin_memcpy(mac, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, mac, ETH_ALEN);
	__u32 a = ip->saddr;
	ip->saddr = ip->daddr;
	ip->daddr = a; /* the IP header checksum is a sum: swapping two words leaves it valid */
	__u16 port = udp->source;
	udp->source = udp->dest;
	udp->dest = port;
	udp->check = 0;
	return XDP_TX;
}
