//! Capabilities kept by sandboxed commands, and the code that drops the rest.
//!
//! Commands run as uid 0 of the sandbox. For uid 0 the kernel grants after `execve` the
//! inheritable set plus the bounding set, so both are cut down to [`DEFAULT_KEEP`].

/// Capability numbers (linux/capability.h).
pub mod nr {
    pub const CHOWN: u8 = 0;
    pub const DAC_OVERRIDE: u8 = 1;
    pub const FOWNER: u8 = 3;
    pub const FSETID: u8 = 4;
    pub const KILL: u8 = 5;
    pub const SETGID: u8 = 6;
    pub const SETUID: u8 = 7;
    pub const NET_BIND_SERVICE: u8 = 10;
}

/// The set a command keeps: what a root shell user needs to manage files, users and its own
/// processes, and to bind low ports. Everything else (SYS_ADMIN, SYS_PTRACE, SYS_MODULE,
/// SYS_CHROOT, MKNOD, NET_ADMIN, NET_RAW, SYS_TIME, SYS_BOOT, SETFCAP, SETPCAP, ...) is dropped.
pub const DEFAULT_KEEP: &[u8] = &[
    nr::CHOWN,
    nr::DAC_OVERRIDE,
    nr::FOWNER,
    nr::FSETID,
    nr::KILL,
    nr::SETGID,
    nr::SETUID,
    nr::NET_BIND_SERVICE,
];

/// Errors of dropping capabilities.
#[derive(Debug, thiserror::Error)]
pub enum CapsError {
    #[error("dropping capability {cap} from the bounding set: {source}")]
    Bounding { cap: u8, source: std::io::Error },
    #[error("capset: {0}")]
    Capset(std::io::Error),
    #[error("clearing ambient capabilities: {0}")]
    Ambient(std::io::Error),
}

/// Highest capability number the kernel knows.
pub fn last_cap() -> u8 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40)
}

/// Reduce the calling thread to `keep`: bounding, ambient, inheritable, permitted, effective.
pub fn drop_to(keep: &[u8], last_cap: u8) -> Result<(), CapsError> {
    for cap in 0..=last_cap {
        if keep.contains(&cap) {
            continue;
        }
        // SAFETY: prctl with integer arguments only.
        let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap), 0, 0, 0) };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            // EINVAL: the kernel does not know this capability.
            if e.raw_os_error() != Some(libc::EINVAL) {
                return Err(CapsError::Bounding { cap, source: e });
            }
        }
    }
    // SAFETY: prctl with integer arguments only.
    let rc = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    if rc != 0 {
        return Err(CapsError::Ambient(std::io::Error::last_os_error()));
    }
    let mut mask = [0u32; 2];
    for &cap in keep {
        mask[usize::from(cap / 32)] |= 1 << (cap % 32);
    }
    if capset(mask) != 0 {
        return Err(CapsError::Capset(std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Set the calling thread's effective, permitted and inheritable sets to `mask` (two 32-bit
/// words, capabilities 0-31 and 32-63); the raw return code (no allocation, so a forked child
/// may call it before `execve`).
pub(crate) fn capset(mask: [u32; 2]) -> libc::c_long {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let header = Header {
        version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
        pid: 0,
    };
    let data = [
        Data {
            effective: mask[0],
            permitted: mask[0],
            inheritable: mask[0],
        },
        Data {
            effective: mask[1],
            permitted: mask[1],
            inheritable: mask[1],
        },
    ];
    // SAFETY: header and data are repr(C) structs laid out as the kernel's
    // __user_cap_header_struct and two __user_cap_data_struct (version 3), alive for the call.
    unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) }
}

/// Parse the `CapEff` line of `/proc/PID/status` into capability numbers.
pub fn parse_cap_mask(hex: &str) -> Vec<u8> {
    let v = u64::from_str_radix(hex.trim(), 16).unwrap_or(0);
    (0..64u8).filter(|c| v & (1u64 << c) != 0).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_masks_parse() {
        assert_eq!(
            parse_cap_mask("00000000000004fb"),
            vec![0, 1, 3, 4, 5, 6, 7, 10]
        );
        let mut keep = DEFAULT_KEEP.to_vec();
        keep.sort();
        assert_eq!(parse_cap_mask("00000000000004fb"), keep);
    }
}
