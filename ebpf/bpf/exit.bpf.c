// SPDX-License-Identifier: GPL-2.0
/* Vigil process-exit detector.
 *
 * - sched/sched_process_exit: emits one exit_event per watched thread group,
 *   from the thread for which group_dead is true (the last one to exit).
 * - signal/signal_generate: remembers, per watched process and signal number,
 *   who generated the signal, so the exit event can name the killer.
 * - oom/mark_victim: flags watched processes chosen by the OOM killer.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include "events.h"
#include "output.h"

char LICENSE[] SEC("license") = "GPL";

#define SIGNAL_GROUP_EXIT 0x00000004 /* include/linux/sched/signal.h */
#define NSIG_TRACKED 32              /* standard signals 1..31 */
#define TRACE_SIGNAL_DELIVERED 0
#define TRACE_SIGNAL_LOSE_INFO 4

struct vigil_sig_origin {
	__u32 sender_pid; /* 0 == none recorded */
	__s32 si_code;
};

struct vigil_pending {
	__u32 oom;
	__u32 _pad;
	struct vigil_sig_origin sig[NSIG_TRACKED];
};

/* tgid -> 1. Filled by userspace; entry is deleted (claimed) by the exit
 * program, so a tgid is reported at most once per watch(). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, __u8);
} WATCHED SEC(".maps");

/* tgid -> signal origins / oom flag collected before the exit. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct vigil_pending);
} PENDING SEC(".maps");

VIGIL_EVENTS_MAP(EXIT_EVENTS);

static __always_inline struct vigil_pending *pending_get(__u32 tgid)
{
	struct vigil_pending *p = bpf_map_lookup_elem(&PENDING, &tgid);
	if (p)
		return p;
	struct vigil_pending zero;
	__builtin_memset(&zero, 0, sizeof(zero));
	bpf_map_update_elem(&PENDING, &tgid, &zero, BPF_NOEXIST);
	return bpf_map_lookup_elem(&PENDING, &tgid);
}

SEC("tracepoint/signal/signal_generate")
int vigil_signal_generate(struct trace_event_raw_signal_generate *ctx)
{
	int result = ctx->result;
	if (result != TRACE_SIGNAL_DELIVERED && result != TRACE_SIGNAL_LOSE_INFO)
		return 0;
	int sig = ctx->sig;
	if (sig <= 0 || sig >= NSIG_TRACKED)
		return 0;

	__u64 id = bpf_get_current_pid_tgid();
	__u32 cur_tgid = id >> 32;
	__u32 cur_tid = (__u32)id;
	__u32 target = ctx->pid;
	__u32 key;

	if (bpf_map_lookup_elem(&WATCHED, &target)) {
		/* kill(2)/process-directed signals target the leader: pid == tgid. */
		key = target;
	} else if (target == cur_tid && bpf_map_lookup_elem(&WATCHED, &cur_tgid)) {
		/* synchronous fault (SIGSEGV, SIGBUS, ...) raised on a non-leader thread */
		key = cur_tgid;
	} else {
		return 0;
	}

	struct vigil_pending *p = pending_get(key);
	if (!p)
		return 0;
	p->sig[sig & (NSIG_TRACKED - 1)].sender_pid = cur_tgid;
	p->sig[sig & (NSIG_TRACKED - 1)].si_code = ctx->code;
	return 0;
}

SEC("tracepoint/oom/mark_victim")
int vigil_mark_victim(struct trace_event_raw_mark_victim *ctx)
{
	__u32 pid = ctx->pid;
	if (!bpf_map_lookup_elem(&WATCHED, &pid))
		return 0; /* non-leader victims are caught via signal->oom_mm at exit */
	struct vigil_pending *p = pending_get(pid);
	if (p)
		p->oom = 1;
	return 0;
}

/* Whether the exiting thread is the last one of its thread group.
 *
 * Linux 6.16 gave sched_process_exit its own record with a group_dead field, and moved it before exit_mm()
 * (before, the event used the sched_process_template class: comm, pid, prio, and fired after the address space
 * was released, so there the event of a large process comes after its memory is freed). Where the field is missing (6.1, 5.14, 4.18), the CO-RE
 * existence check is false and the verifier never walks the read of it; the answer comes from the counter
 * do_exit() decremented before the tracepoint on every kernel: signal->live is 0 once the last thread passed
 * atomic_dec_and_test(). A non-last thread that reaches the tracepoint after that also sees 0; the claim on
 * WATCHED below still reports the group once, at most a few microseconds before its last thread. */
static __always_inline bool vigil_group_dead(struct trace_event_raw_sched_process_exit *ctx, struct task_struct *task)
{
	if (bpf_core_field_exists(ctx->group_dead))
		return ctx->group_dead;
	return BPF_CORE_READ(task, signal, live.counter) == 0;
}

SEC("tracepoint/sched/sched_process_exit")
int vigil_process_exit(struct trace_event_raw_sched_process_exit *ctx)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	if (!vigil_group_dead(ctx, task))
		return 0;

	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;

	/* Atomic claim: only the one who deletes the entry reports the exit
	 * (userspace deletes it too when it detects a pre-watch exit). */
	if (bpf_map_delete_elem(&WATCHED, &tgid) != 0)
		return 0;

	int exit_code = BPF_CORE_READ(task, exit_code);
	unsigned int sflags = BPF_CORE_READ(task, signal, flags);
	int group_code = BPF_CORE_READ(task, signal, group_exit_code);
	void *oom_mm = BPF_CORE_READ(task, signal, oom_mm);
	/* Same rule as wait_task_zombie(). */
	__u32 status = (sflags & SIGNAL_GROUP_EXIT) ? (__u32)group_code : (__u32)exit_code;

	struct vigil_exit_event ev;
	__builtin_memset(&ev, 0, sizeof(ev));
	struct vigil_exit_event *e = &ev;
	e->ktime_ns = bpf_ktime_get_ns();
	e->pid = tgid;
	e->tid = (__u32)id;
	e->wait_status = status;
	e->flags = oom_mm ? VIGIL_EXIT_OOM : 0;
	e->sender_pid = 0;
	e->si_code = 0;
	bpf_get_current_comm(&e->comm, sizeof(e->comm));

	struct vigil_pending *p = bpf_map_lookup_elem(&PENDING, &tgid);
	if (p) {
		if (p->oom)
			e->flags |= VIGIL_EXIT_OOM;
		__u32 signo = status & 0x7f;
		if (signo != 0 && signo < NSIG_TRACKED) {
			struct vigil_sig_origin *o = &p->sig[signo & (NSIG_TRACKED - 1)];
			if (o->sender_pid) {
				e->sender_pid = o->sender_pid;
				e->si_code = o->si_code;
				e->flags |= VIGIL_EXIT_HAS_SENDER;
			}
		}
		bpf_map_delete_elem(&PENDING, &tgid);
	}
	vigil_output(ctx, &EXIT_EVENTS, e);
	return 0;
}
