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
#include "frame.h"

char LICENSE[] SEC("license") = "GPL";

/* Set by the loader before the program is loaded. */
volatile const __u32 TARGET_IFINDEX = 0;
volatile const __u32 TARGET_ADDR = 0; /* IPv4, network byte order */

SEC("xdp")
int vigil_hub_redirect(struct xdp_md *ctx)
{
	struct vigil_frame f;
	if (!vigil_frame_parse(ctx, &f) || f.ip->daddr != TARGET_ADDR)
		return XDP_PASS;
	if (f.p->type != VIGIL_PROBE_REPLY_XDP && f.p->type != VIGIL_PROBE_REPLY_USER)
		return XDP_PASS;
	return bpf_redirect(TARGET_IFINDEX, 0);
}
