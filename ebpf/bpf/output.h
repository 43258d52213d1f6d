/* How the tracing programs (exit.bpf.c, tcp.bpf.c) hand their events to userspace. Include after the libbpf
 * headers.
 *
 * Default: the BPF ring buffer (BPF_MAP_TYPE_RINGBUF and bpf_ringbuf_output, Linux 5.8), one buffer for all CPUs
 * in event order. Built with -DVIGIL_PERFBUF (the *-perfbuf.bpf.o objects, chosen where the kernel has no ring
 * buffer): a perf event array (BPF_MAP_TYPE_PERF_EVENT_ARRAY and bpf_perf_event_output, 4.3/4.4), one buffer per
 * CPU that userspace opens (src/ring.rs), and the CO-RE reads through bpf_probe_read (4.1) instead of
 * bpf_probe_read_kernel (5.5), which reads kernel memory the same on x86. */
#ifndef VIGIL_OUTPUT_H
#define VIGIL_OUTPUT_H

#ifdef VIGIL_PERFBUF
#define VIGIL_EVENTS_MAP(name)                                                                                 \
	struct {                                                                                               \
		__uint(type, BPF_MAP_TYPE_PERF_EVENT_ARRAY);                                                   \
		__uint(key_size, sizeof(__u32));                                                               \
		__uint(value_size, sizeof(__u32));                                                             \
	} name SEC(".maps")
#define vigil_output(ctx, map, ev) bpf_perf_event_output(ctx, map, BPF_F_CURRENT_CPU, ev, sizeof(*(ev)))
/* bpf_core_read.h expands to bpf_probe_read_kernel at each use: this sends those reads to the older helper. */
#define bpf_probe_read_kernel bpf_probe_read
#else
#define VIGIL_EVENTS_MAP(name)                                                                                 \
	struct {                                                                                               \
		__uint(type, BPF_MAP_TYPE_RINGBUF);                                                            \
		__uint(max_entries, 256 * 1024);                                                               \
	} name SEC(".maps")
#define vigil_output(ctx, map, ev) bpf_ringbuf_output(map, ev, sizeof(*(ev)), 0)
#endif

#endif
