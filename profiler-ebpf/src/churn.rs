//! cgroup churn: raw tracepoints on cgroup_mkdir / cgroup_rmdir count who creates and removes
//! cgroups (the source of dying memcgs). Raw tracepoints need no tracefs; the counts stay in
//! a hash map that the doctor reads at the end, since mkdir rates are low.
use aya_ebpf::{
    EbpfContext as _,
    helpers::{bpf_probe_read_kernel, bpf_probe_read_kernel_str_bytes},
    macros::{map, raw_tracepoint},
    maps::HashMap,
    programs::RawTracePointContext,
};
use profiler_common::{
    COMM_LEN,
    churn::{
        AttachKey, ChurnKey, EVENT_MKDIR, EVENT_RMDIR, MAX_ATTACH, MAX_ENTRIES, PARENT_LEN,
        PATH_LEN,
    },
};

#[map(name = "CHURN")]
static CHURN: HashMap<ChurnKey, u64> = HashMap::with_max_entries(MAX_ENTRIES, 0);

#[map(name = "ATTACH")]
static ATTACH: HashMap<AttachKey, u64> = HashMap::with_max_entries(MAX_ATTACH, 0);

/// Set at load time: offset of `tgid` in `struct task_struct` (from the kernel's BTF).
#[unsafe(no_mangle)]
static TGID_OFFSET: u64 = 0;

#[raw_tracepoint(tracepoint = "cgroup_mkdir")]
pub fn churn_mkdir(ctx: RawTracePointContext) -> i32 {
    count(&ctx, EVENT_MKDIR);
    0
}

#[raw_tracepoint(tracepoint = "cgroup_rmdir")]
pub fn churn_rmdir(ctx: RawTracePointContext) -> i32 {
    count(&ctx, EVENT_RMDIR);
    0
}

/// Which process went into which cgroup: the link from a churned cgroup to the program
/// that keeps dying in it.
#[raw_tracepoint(tracepoint = "cgroup_attach_task")]
pub fn churn_attach(ctx: RawTracePointContext) -> i32 {
    attached(&ctx);
    0
}

#[inline(always)]
fn attached(ctx: &RawTracePointContext) {
    // SAFETY: a load-time constant; read_volatile keeps the compiler from folding the 0.
    let offset = unsafe { core::ptr::read_volatile(&TGID_OFFSET) };
    if offset == 0 {
        return;
    }
    // TP_PROTO(struct cgroup *dst_cgrp, const char *path, struct task_struct *task, bool
    // threadgroup): the moved task is often not current (a service manager moves a child).
    let path: *const u8 = ctx.arg(1);
    let task: *const u8 = ctx.arg(2);
    // SAFETY: a kernel pointer from the tracepoint; the helper checks the read.
    let Ok(tgid) =
        (unsafe { bpf_probe_read_kernel(task.wrapping_add(offset as usize).cast::<i32>()) })
    else {
        return;
    };
    let mut key = AttachKey {
        pid: tgid as u32,
        path: [0u8; PATH_LEN],
    };
    // SAFETY: the tracepoint's path argument is a kernel string; the helper bounds the copy.
    if unsafe { bpf_probe_read_kernel_str_bytes(path, &mut key.path) }.is_err() {
        return;
    }
    match ATTACH.get_ptr_mut(&key) {
        // SAFETY: a pointer into the map value; a lost increment under a race is acceptable.
        Some(v) => unsafe { *v += 1 },
        None => {
            // A full map drops the link (that process's cgroup stays unknown).
            let _ = ATTACH.insert(&key, &1, 0);
        }
    }
}

#[inline(always)]
fn count(ctx: &RawTracePointContext, event: u32) {
    // TP_PROTO(struct cgroup *cgrp, const char *path): the path within the hierarchy.
    let path: *const u8 = ctx.arg(1);
    let mut key = ChurnKey {
        pid: ctx.tgid(),
        event,
        comm: ctx.command().unwrap_or([0u8; COMM_LEN]),
        parent: [0u8; PARENT_LEN],
    };
    // SAFETY: the tracepoint's path argument is a kernel string; the helper bounds the copy.
    if unsafe { bpf_probe_read_kernel_str_bytes(path, &mut key.parent) }.is_err() {
        key.parent = [0u8; PARENT_LEN];
    }
    // Counting per parent rather than per path keeps one entry per creator and place, so a
    // burst of thousands of cgroups cannot fill the map.
    to_parent(&mut key.parent);
    match CHURN.get_ptr_mut(&key) {
        // SAFETY: a pointer into the map value; a lost increment under a race is acceptable.
        Some(v) => unsafe { *v += 1 },
        None => {
            // A full map drops the event: the doctor reports rates, not exact totals.
            let _ = CHURN.insert(&key, &1, 0);
        }
    }
}

/// Cuts `/a/b/c` to `/a/b` (and `/c` to `/`) in place.
#[inline(always)]
fn to_parent(path: &mut [u8; PARENT_LEN]) {
    let mut last = 0usize;
    let mut i = 0usize;
    while i < PARENT_LEN {
        let b = path[i];
        if b == 0 {
            break;
        }
        if b == b'/' {
            last = i;
        }
        i += 1;
    }
    let keep = if last == 0 { 1 } else { last };
    let mut j = 0usize;
    while j < PARENT_LEN {
        if j >= keep {
            path[j] = 0;
        }
        j += 1;
    }
}
