/* Parsing of a heartbeat probe frame, shared by the XDP programs (xdp.bpf.c, hub.bpf.c). BPF side only. */
#ifndef VIGIL_FRAME_H
#define VIGIL_FRAME_H

#include "probe.h"

#define ETH_P_IP 0x0800 /* include/uapi/linux/if_ether.h */
#define ETH_ALEN 6

/* The headers of a probe frame, pointing into the packet. */
struct vigil_frame {
	struct ethhdr *eth;
	struct iphdr *ip;
	struct udphdr *udp;
	struct vigil_probe *p;
};

/* Fills `f` and returns 1 if the frame is Ethernet + IPv4 without options, not a fragment + UDP + a probe with
 * our magic and version; returns 0 for anything else (which the caller passes on untouched). */
static __always_inline int vigil_frame_parse(struct xdp_md *ctx, struct vigil_frame *f)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP))
		return 0;
	struct iphdr *ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > end || ip->ihl != 5 || ip->protocol != IPPROTO_UDP)
		return 0;
	if (ip->frag_off & bpf_htons(0x3fff)) /* fragment */
		return 0;
	struct udphdr *udp = (void *)(ip + 1);
	struct vigil_probe *p = (void *)(udp + 1);
	if ((void *)(p + 1) > end)
		return 0;
	if (p->magic != bpf_htonl(VIGIL_PROBE_MAGIC) || p->version != VIGIL_PROBE_VERSION)
		return 0;
	f->eth = eth;
	f->ip = ip;
	f->udp = udp;
	f->p = p;
	return 1;
}

#endif
