//! Time: a skewed wall clock.
//!
//! The kernel's clocks cannot be set per sandbox (no time namespace for CLOCK_REALTIME), so
//! the skew comes from libfaketime, preloaded into every command of the agent. Verifiers and
//! start steps run without it.

use super::{Family, Info, Kind, ParamSpec, Params, ParamsExt, PerturbError, Perturbation};
use crate::instance::Builder;

pub fn all() -> Vec<&'static dyn Perturbation> {
    vec![&ClockSkew]
}

pub struct ClockSkew;

static CLOCK_SKEW: Info = Info {
    name: "clock-skew",
    family: Family::Time,
    summary: "the wall clock is off: `date`, file times of new files, TLS and token checks, \
              make and cron see a different time",
    mechanism: "libfaketime preloaded into the agent's commands (LD_PRELOAD of the base's \
                libfaketime.so.1, FAKETIME=<+/-seconds>, DONT_FAKE_MONOTONIC=1 so timeouts \
                and sleeps keep working); not applicable when the base has no libfaketime \
                (Debian package libfaketime, pulled in by `faketime`)",
    params: &[ParamSpec {
        name: "seconds",
        kind: Kind::Int {
            min: -315_360_000,
            max: 315_360_000,
        },
        default: "3600",
        realistic: "±1-300 (NTP not running), ±3600 (timezone mix-up), ±days to years (dead \
                    CMOS battery, restored VM snapshot)",
        help: "offset added to the wall clock (negative: in the past)",
    }],
};

/// Where Debian and others install libfaketime, relative to a library directory.
const FAKETIME_LIB: &str = "faketime/libfaketime.so.1";

fn find_libfaketime(b: &Builder) -> Option<String> {
    let mut dirs: Vec<String> = Vec::new();
    for top in ["/usr/lib", "/lib", "/usr/lib64", "/usr/local/lib"] {
        let Some(top) = super::fs::canonical(b, top, true) else {
            continue;
        };
        for sub in b.list(&top) {
            if sub.ends_with("-linux-gnu") || sub.ends_with("-linux-gnueabihf") {
                dirs.push(format!("{top}/{sub}"));
            }
        }
        dirs.push(top);
    }
    dirs.into_iter()
        .map(|d| format!("{d}/{FAKETIME_LIB}"))
        .find(|p| b.meta(p).is_some_and(|m| !m.is_dir))
}

impl Perturbation for ClockSkew {
    fn info(&self) -> &'static Info {
        &CLOCK_SKEW
    }

    fn apply(
        &self,
        params: &Params,
        _purpose: &str,
        b: &mut Builder,
    ) -> Result<String, PerturbError> {
        let lib = find_libfaketime(b).ok_or_else(|| {
            PerturbError::NotApplicable(
                "the base has no libfaketime (install the `faketime` package in it: \
                 apt-get install faketime)"
                    .into(),
            )
        })?;
        let secs = params.int("seconds");
        let preload = match b.runtime.env.get("LD_PRELOAD") {
            Some(Some(old)) if !old.is_empty() && !old.split(':').any(|p| p == lib) => {
                format!("{lib}:{old}")
            }
            _ => lib.clone(),
        };
        b.runtime.env.insert("LD_PRELOAD".into(), Some(preload));
        b.runtime
            .env
            .insert("FAKETIME".into(), Some(format!("{secs:+}")));
        b.runtime
            .env
            .insert("DONT_FAKE_MONOTONIC".into(), Some("1".into()));
        Ok(format!("wall clock {secs:+} s (libfaketime {lib})"))
    }
}
