// SPDX-License-Identifier: GPL-2.0
/* Test-bed switch port (benchmarks only, not loaded by brokers).
 *
 * On the netns test bed every node is a network namespace whose veth ends on one bridge. A reply a child's
 * kernel sends there reaches the parent as a socket buffer, so the parent's receive path costs what a veth
 * costs, not what a NIC with native XDP costs. Attached in native mode to the hub's end of each child's veth,
 * this program hands every heartbeat probe reply addressed to TARGET_ADDR straight to TARGET_IFINDEX (the hub's
 * end of the parent's veth) as an XDP frame: it arrives in the parent's receive ring as a frame, and the
 * parent's XDP program (native mode) consumes it without a socket buffer ever being built, the way a NIC
 * driver's ring and native XDP do. Everything else is passed to the bridge untouched. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "probe.h"

char LICENSE[] SEC("license") = "GPL";

#define ETH_P_IP 0x0800 /* include/uapi/linux/if_ether.h */

/* Set by the loader before the program is loaded. */
volatile const __u32 TARGET_IFINDEX = 0;
volatile const __u32 TARGET_ADDR = 0; /* IPv4, network byte order */

SEC("xdp")
int vigil_hub_redirect(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP))
		return XDP_PASS;
	struct iphdr *ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > end || ip->ihl != 5 || ip->protocol != IPPROTO_UDP || ip->daddr != TARGET_ADDR)
		return XDP_PASS;
	struct udphdr *udp = (void *)(ip + 1);
	struct vigil_probe *p = (void *)(udp + 1);
	if ((void *)(p + 1) > end || p->magic != bpf_htonl(VIGIL_PROBE_MAGIC))
		return XDP_PASS;
	if (p->type != VIGIL_PROBE_REPLY_XDP && p->type != VIGIL_PROBE_REPLY_USER)
		return XDP_PASS;
	return bpf_redirect(TARGET_IFINDEX, 0);
}
