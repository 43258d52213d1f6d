// SPDX-License-Identifier: GPL-2.0
/* Vigil heartbeat responder (XDP).
 *
 * Answers a parent's UDP heartbeat probe in the kernel, for every broker registered in RESPONDERS (keyed by the
 * UDP port of the broker's probe socket): the reply says whether the broker is alive and how old its last
 * userspace heartbeat is. So a parent tells "node up, broker stalled for X ms" from "node gone" without
 * waiting on the child's userspace. Everything that is not a well-formed probe for a registered port is passed
 * to the stack untouched. IPv4, no IP options. The reply is sent back out of the interface it came in on
 * (XDP_TX) with the Ethernet/IP addresses and UDP ports swapped; the UDP checksum is set to 0 (none, legal
 * for IPv4) because the payload changed. No kernel structure is read, so no CO-RE relocation is needed. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "probe.h"

char LICENSE[] SEC("license") = "GPL";

#define ETH_P_IP 0x0800 /* include/uapi/linux/if_ether.h */
#define ETH_ALEN 6

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, struct vigil_hb_state);
} RESPONDERS SEC(".maps");

static __always_inline __u64 htonll(__u64 v)
{
	return ((__u64)bpf_htonl((__u32)v) << 32) | bpf_htonl((__u32)(v >> 32));
}

SEC("xdp")
int vigil_hb_responder(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP))
		return XDP_PASS;
	struct iphdr *ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > end || ip->ihl != 5 || ip->protocol != IPPROTO_UDP)
		return XDP_PASS;
	if (ip->frag_off & bpf_htons(0x3fff)) /* fragment */
		return XDP_PASS;
	struct udphdr *udp = (void *)(ip + 1);
	struct vigil_probe *p = (void *)(udp + 1);
	if ((void *)(p + 1) > end)
		return XDP_PASS;
	if (p->magic != bpf_htonl(VIGIL_PROBE_MAGIC) || p->version != VIGIL_PROBE_VERSION ||
	    p->type != VIGIL_PROBE_REQUEST)
		return XDP_PASS;
	__u32 key = udp->dest;
	struct vigil_hb_state *st = bpf_map_lookup_elem(&RESPONDERS, &key);
	if (!st)
		return XDP_PASS; /* not ours: a userspace responder (or nobody) answers */

	__u64 now = bpf_ktime_get_ns();
	__u64 hb = st->hb_ns;
	__u64 answered = __sync_fetch_and_add(&st->answered, 1) + 1;
	p->type = VIGIL_PROBE_REPLY_XDP;
	p->flags = bpf_htons(st->alive ? VIGIL_PROBE_ALIVE : 0);
	p->hb_age_ns = htonll(now > hb ? now - hb : 0);
	p->answered = htonll(answered);

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
