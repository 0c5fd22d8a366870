//! cgroup churn: raw tracepoints on cgroup_mkdir / cgroup_rmdir count who creates and removes
//! cgroups (the source of dying memcgs). Raw tracepoints need no tracefs; the counts stay in
//! hash maps (per process, and per process and path) that userspace reads, since mkdir rates
//! are low.
use aya_ebpf::{
    EbpfContext as _,
    helpers::{bpf_probe_read_kernel, bpf_probe_read_kernel_str_bytes},
    macros::{map, raw_tracepoint},
    maps::{HashMap, LruHashMap},
    programs::RawTracePointContext,
};
use profiler_common::{
    COMM_LEN,
    churn::{
        AttachKey, ChurnKey, ChurnPathKey, EVENT_MKDIR, EVENT_RMDIR, MAX_ATTACH, MAX_ENTRIES,
        MAX_PATHS, PATH_LEN,
    },
};

#[map(name = "CHURN")]
static CHURN: HashMap<ChurnKey, u64> = HashMap::with_max_entries(MAX_ENTRIES, 0);

#[map(name = "CHURN_PATHS")]
static CHURN_PATHS: LruHashMap<ChurnPathKey, u64> = LruHashMap::with_max_entries(MAX_PATHS, 0);

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
    let pid = ctx.tgid();
    let key = ChurnKey {
        pid,
        event,
        comm: ctx.command().unwrap_or([0u8; COMM_LEN]),
    };
    increment(&CHURN, &key);
    // TP_PROTO(struct cgroup *cgrp, const char *path): the path within the hierarchy. Its
    // parent is found in userspace: a byte loop here costs the verifier a state per place a
    // `/` may be, hundreds of thousands of instructions for a path of 256 bytes.
    let path: *const u8 = ctx.arg(1);
    let mut at = ChurnPathKey {
        pid,
        event,
        path: [0u8; PATH_LEN],
    };
    // SAFETY: the tracepoint's path argument is a kernel string; the helper bounds the copy.
    if unsafe { bpf_probe_read_kernel_str_bytes(path, &mut at.path) }.is_ok() {
        match CHURN_PATHS.get_ptr_mut(&at) {
            // SAFETY: a pointer into the map value; a lost increment under a race is fine.
            Some(v) => unsafe { *v += 1 },
            // The map is an LRU: a new path evicts the oldest.
            None => {
                let _ = CHURN_PATHS.insert(&at, &1, 0);
            }
        }
    }
}

/// Adds one to `key`'s count; a full map drops the event (the doctor reports rates).
#[inline(always)]
fn increment(map: &HashMap<ChurnKey, u64>, key: &ChurnKey) {
    match map.get_ptr_mut(key) {
        // SAFETY: a pointer into the map value; a lost increment under a race is acceptable.
        Some(v) => unsafe { *v += 1 },
        None => {
            let _ = map.insert(key, &1, 0);
        }
    }
}
