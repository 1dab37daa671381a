//! What a one-shot's command came to, and how `engine` reports it: its output, a line on
//! what ended it, and the exit status.

use sandbox::{ExecResult, Termination};

/// Exit code of `engine sandbox exec` when the sandbox itself failed.
pub const EXIT_SANDBOX_FAILURE: i32 = 125;
/// Exit code when the command could not be executed (found but not runnable).
pub const EXIT_CANNOT_EXECUTE: i32 = 126;
/// Exit code when the command was not found.
pub const EXIT_NOT_FOUND: i32 = 127;
/// The usage error of a one-shot without a command.
pub const NO_COMMAND: &str = "no command given: engine sandbox exec [OPTIONS] -- CMD...";
/// Exit code when the wall timeout passed.
pub const EXIT_TIMEOUT: i32 = 124;

/// What a one-shot's command came to, wherever its sandbox was made.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub enum Outcome {
    /// It ran (and exited, was killed or timed out).
    Ran(ExecResult),
    /// It did not run: its sandbox could not be made, or could not execute it. The exit
    /// status and the message `engine` prints.
    NotRun { code: i32, message: String },
}

/// The most output a one-shot keeps per stream.
pub const OUTPUT_CAP: u64 = 64 << 20;

impl Outcome {
    /// Print the command's output and what ended it; the exit status of `engine`.
    pub fn report(self, memory: &str, timeout: std::time::Duration) -> anyhow::Result<i32> {
        let result = match self {
            Outcome::Ran(r) => r,
            Outcome::NotRun { code, message } => {
                eprintln!("engine: {message}");
                return Ok(code);
            }
        };
        use std::io::Write;
        std::io::stdout().write_all(&result.stdout)?;
        std::io::stderr().write_all(&result.stderr)?;
        if result.stdout_truncated || result.stderr_truncated {
            eprintln!("engine: output truncated at {OUTPUT_CAP} bytes per stream");
        }
        match result.termination {
            Termination::TimedOut => {
                eprintln!(
                    "engine: timed out after {timeout:?}; the command's process tree was killed"
                );
            }
            Termination::Signaled(s) if result.oom_killed => {
                eprintln!("engine: killed by signal {s}: out of memory (limit {memory})");
            }
            Termination::Signaled(s) => eprintln!("engine: killed by signal {s}"),
            Termination::Exited(_) => {}
        }
        Ok(match result.termination {
            Termination::TimedOut => EXIT_TIMEOUT,
            _ => result.exit_code(),
        })
    }
}

/// The exit status of `engine` ended by signal `sig`.
pub fn signal_exit_status(sig: i32) -> i32 {
    128 + sig
}

/// The name `engine` gives a signal that ends it (SIGINT, SIGTERM, SIGHUP).
pub fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        _ => "signal",
    }
}
