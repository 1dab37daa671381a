//! Standard output of the command line. A reader that goes away (`engine ... | head`) ends the
//! output, not the work: the command still finishes and tears its sandboxes down, where
//! `println!` would panic on the broken pipe. (SIGPIPE stays ignored: the engine also writes
//! to sandbox sockets, where a dead peer must be an error, not a kill.)

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

static CLOSED: AtomicBool = AtomicBool::new(false);

/// Write to standard output; after the first failed write, drop everything.
pub fn emit(args: std::fmt::Arguments<'_>) {
    if CLOSED.load(Ordering::Relaxed) {
        return;
    }
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.flush()) {
        CLOSED.store(true, Ordering::Relaxed);
        tracing::debug!(error = %e, "standard output closed; the rest of the output is dropped");
    }
}

/// `print!` that survives a closed standard output.
macro_rules! out {
    ($($t:tt)*) => {
        $crate::cli::out::emit(format_args!($($t)*))
    };
}

/// `println!` that survives a closed standard output.
macro_rules! outln {
    () => {
        $crate::cli::out::emit(format_args!("\n"))
    };
    ($($t:tt)*) => {
        $crate::cli::out::emit(format_args!("{}\n", format_args!($($t)*)))
    };
}
