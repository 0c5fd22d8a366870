//! Where a thread's pthread-specific data is, found once per run: the offset of
//! `thread.fsbase` in the kernel's `task_struct` (from the kernel's BTF) and of glibc's first
//! block of thread-specific values from the thread pointer (measured on our own thread).
//! The sampler needs both to find the sampled thread's own PyThreadState.
use std::io;

const BTF_KIND_STRUCT: u32 = 4;
const BTF_KIND_UNION: u32 = 5;
const BTF_KIND_TYPEDEF: u32 = 8;

/// Offset in bytes of `task_struct.thread.fsbase`, from /sys/kernel/btf/vmlinux.
pub(super) fn fsbase_offset() -> io::Result<u32> {
    let data = std::fs::read("/sys/kernel/btf/vmlinux")?;
    let btf = Btf::parse(&data).ok_or_else(|| bad("cannot parse the kernel's BTF"))?;
    let task = btf
        .struct_named("task_struct")
        .ok_or_else(|| bad("no task_struct in the kernel's BTF"))?;
    let (thread_ty, thread_bits) = btf
        .member(task, "thread")
        .ok_or_else(|| bad("no task_struct.thread in BTF"))?;
    let (_, fs_bits) = btf
        .member(btf.resolve(thread_ty), "fsbase")
        .ok_or_else(|| bad("no thread_struct.fsbase in BTF (not x86_64?)"))?;
    Ok((thread_bits + fs_bits) / 8)
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_owned())
}

/// Just enough of BTF: the offset of every type's record, to read structs' members.
struct Btf<'a> {
    types: &'a [u8],
    strings: &'a [u8],
    /// Byte offset in `types` of type id i + 1.
    offsets: Vec<usize>,
}

impl<'a> Btf<'a> {
    fn parse(data: &'a [u8]) -> Option<Self> {
        let u32_at = |o: usize| Some(u32::from_le_bytes(data.get(o..o + 4)?.try_into().ok()?));
        if data.get(..2)? != [0x9f, 0xeb] {
            return None; // only little-endian BTF (x86_64) is read
        }
        let hdr_len = u32_at(4)? as usize;
        let (type_off, type_len) = (u32_at(8)? as usize, u32_at(12)? as usize);
        let (str_off, str_len) = (u32_at(16)? as usize, u32_at(20)? as usize);
        let types = data.get(hdr_len + type_off..hdr_len + type_off + type_len)?;
        let strings = data.get(hdr_len + str_off..hdr_len + str_off + str_len)?;
        let mut offsets = Vec::new();
        let mut o = 0usize;
        while o + 12 <= types.len() {
            offsets.push(o);
            let info = u32::from_le_bytes(types[o + 4..o + 8].try_into().ok()?);
            let (kind, vlen) = ((info >> 24) & 0x1f, (info & 0xffff) as usize);
            o += 12
                + match kind {
                    1 | 14 | 17 => 4,             // int, var, decl tag
                    3 => 12,                      // array
                    4 | 5 | 15 | 19 => 12 * vlen, // struct, union, datasec, enum64
                    6 | 13 => 8 * vlen,           // enum, func proto
                    _ => 0,
                };
        }
        Some(Self {
            types,
            strings,
            offsets,
        })
    }

    fn word(&self, id: u32, index: usize) -> u32 {
        let o = self.offsets[id as usize - 1] + 4 * index;
        u32::from_le_bytes(self.types[o..o + 4].try_into().expect("4 bytes"))
    }

    fn name(&self, off: u32) -> &[u8] {
        let s = self.strings.get(off as usize..).unwrap_or_default();
        &s[..s.iter().position(|&c| c == 0).unwrap_or(s.len())]
    }

    fn kind(&self, id: u32) -> u32 {
        (self.word(id, 1) >> 24) & 0x1f
    }

    fn struct_named(&self, name: &str) -> Option<u32> {
        (1..=self.offsets.len() as u32).find(|&id| {
            self.kind(id) == BTF_KIND_STRUCT
                && self.word(id, 1) & 0xffff != 0
                && self.name(self.word(id, 0)) == name.as_bytes()
        })
    }

    /// Through typedefs (and const/volatile) to the type itself.
    fn resolve(&self, mut id: u32) -> u32 {
        for _ in 0..16 {
            match self.kind(id) {
                BTF_KIND_TYPEDEF | 9 | 10 | 11 | 18 => id = self.word(id, 2),
                _ => break,
            }
        }
        id
    }

    /// (type id, bit offset) of a member, looking into anonymous structs and unions.
    fn member(&self, id: u32, name: &str) -> Option<(u32, u32)> {
        let kind = self.kind(id);
        if kind != BTF_KIND_STRUCT && kind != BTF_KIND_UNION {
            return None;
        }
        let info = self.word(id, 1);
        let bitfields = info >> 31 == 1;
        for m in 0..(info & 0xffff) as usize {
            let (name_off, ty, off) = (
                self.word(id, 3 + 3 * m),
                self.word(id, 4 + 3 * m),
                self.word(id, 5 + 3 * m),
            );
            let bits = if bitfields { off & 0xff_ffff } else { off };
            if self.name(name_off) == name.as_bytes() {
                return Some((ty, bits));
            }
            if name_off == 0
                && let Some((t, inner)) = self.member(self.resolve(ty), name)
            {
                return Some((t, bits + inner));
            }
        }
        None
    }
}

/// Offset from the thread pointer of glibc's `specific_1stblock[0].data`: set a pthread key
/// on this thread to a marker and find it in this thread's `struct pthread`. Every process
/// using the same glibc build has the same layout (a container with another libc may not).
pub(super) fn tsd_base() -> io::Result<u32> {
    const MARKER: usize = 0x7079_7468_6f6e_2121;
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: plain libc calls on a key we own, deleted before returning.
    unsafe {
        if libc::pthread_key_create(&raw mut key, None) != 0 {
            return Err(io::Error::last_os_error());
        }
        libc::pthread_setspecific(key, MARKER as *const libc::c_void);
    }
    // On x86_64 glibc, pthread_self() is the thread pointer (fsbase) and struct pthread
    // starts there; its first block of specific data lies within its first 2 KiB.
    // SAFETY: plain libc call.
    let me = unsafe { libc::pthread_self() } as usize;
    let found = (0..2048usize).step_by(8).find(|&off| {
        // SAFETY: reads inside this thread's own struct pthread (more than 2 KiB long).
        unsafe { std::ptr::read_volatile((me + off) as *const usize) == MARKER }
    });
    // SAFETY: the key was created above.
    unsafe { libc::pthread_key_delete(key) };
    let off =
        found.ok_or_else(|| bad("pthread-specific data not found near the thread pointer"))?;
    let base = off
        .checked_sub(16 * key as usize)
        .ok_or_else(|| bad("pthread key outside glibc's first block"))?;
    Ok(base as u32)
}

#[cfg(test)]
mod tests {
    #[test]
    fn finds_fsbase_in_the_running_kernel() {
        // Every x86_64 kernel with BTF has it; the value differs by kernel config.
        let off = super::fsbase_offset().expect("fsbase offset");
        assert!(off > 1000 && off < 20_000, "{off}");
    }

    #[test]
    fn tsd_base_finds_the_value_of_another_key() {
        let base = super::tsd_base().expect("tsd base") as usize;
        let mut key: libc::pthread_key_t = 0;
        let value = 0x1234_5678_9abc_usize;
        // SAFETY: libc calls on a key we own; the read is inside this thread's struct
        // pthread, where the sampler reads the same slot of the sampled thread.
        let seen = unsafe {
            assert_eq!(libc::pthread_key_create(&raw mut key, None), 0);
            libc::pthread_setspecific(key, value as *const libc::c_void);
            let me = libc::pthread_self() as usize;
            let seen = std::ptr::read_volatile((me + base + 16 * key as usize) as *const usize);
            libc::pthread_key_delete(key);
            seen
        };
        assert_eq!(seen, value, "key {key} at base {base:#x}");
    }
}
