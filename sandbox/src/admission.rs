//! Admission control: a [`Runtime`](crate::Runtime) refuses a new sandbox, with an error that
//! says why, when the machine's available memory is under a reserve or a cap on live
//! sandboxes is reached, instead of slowing the machine down until it swaps or kills.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The default memory reserve: this share of the machine's memory (`MemTotal`).
pub const DEFAULT_RESERVE_PERCENT: u64 = 3;

/// When new sandboxes are refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    /// Refuse a new sandbox while this many are alive in the runtime (`None`: no cap).
    pub max_sandboxes: Option<usize>,
    /// Refuse a new sandbox while the host's `MemAvailable` is under this many bytes.
    pub memory_reserve_bytes: u64,
}

impl Default for Admission {
    /// No cap; a reserve of [`DEFAULT_RESERVE_PERCENT`] of the machine's memory.
    fn default() -> Self {
        Self {
            max_sandboxes: None,
            memory_reserve_bytes: host_memory_bytes().unwrap_or(0) / 100 * DEFAULT_RESERVE_PERCENT,
        }
    }
}

/// Why a sandbox was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("{live} sandboxes are alive, the cap (ENVFACTORY_MAX_SANDBOXES)")]
    Cap { live: usize },
    #[error("the host has {available_mib} MiB of memory available, under the reserve of {reserve_mib} MiB (ENVFACTORY_MEMORY_RESERVE)")]
    Memory {
        available_mib: u64,
        reserve_mib: u64,
    },
}

impl Admission {
    /// Take a place among the live sandboxes, or say why not. A place taken is given back
    /// with [`release`].
    pub(crate) fn admit(&self, live: &AtomicUsize) -> Result<(), Refusal> {
        if self.memory_reserve_bytes > 0 {
            if let Some(available) = meminfo_bytes("MemAvailable:") {
                if available < self.memory_reserve_bytes {
                    return Err(Refusal::Memory {
                        available_mib: available >> 20,
                        reserve_mib: self.memory_reserve_bytes >> 20,
                    });
                }
            }
        }
        let max = self.max_sandboxes.unwrap_or(usize::MAX);
        live.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
            (n < max).then_some(n + 1)
        })
        .map(|_| ())
        .map_err(|live| Refusal::Cap { live })
    }
}

/// Give back a place taken by [`Admission::admit`].
pub(crate) fn release(live: &AtomicUsize) {
    let _ = live.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
}

/// The machine's memory (`MemTotal`), in bytes.
pub fn host_memory_bytes() -> Option<u64> {
    meminfo_bytes("MemTotal:")
}

/// A field of `/proc/meminfo`, in bytes.
fn meminfo_bytes(field: &str) -> Option<u64> {
    let text = crate::sys::read_proc("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line[field.len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_and_the_reserve_refuse_with_a_reason() {
        let live = AtomicUsize::new(0);
        let a = Admission {
            max_sandboxes: Some(2),
            memory_reserve_bytes: 0,
        };
        assert_eq!(a.admit(&live), Ok(()));
        assert_eq!(a.admit(&live), Ok(()));
        assert_eq!(a.admit(&live), Err(Refusal::Cap { live: 2 }));
        release(&live);
        assert_eq!(a.admit(&live), Ok(()));
        let greedy = Admission {
            max_sandboxes: None,
            memory_reserve_bytes: u64::MAX,
        };
        let e = greedy.admit(&live).unwrap_err();
        assert!(matches!(e, Refusal::Memory { .. }), "{e}");
        assert!(e.to_string().contains("under the reserve"), "{e}");
        assert_eq!(live.load(Ordering::SeqCst), 2, "a refusal takes no place");
        assert!(Admission::default().memory_reserve_bytes > 0);
    }
}
