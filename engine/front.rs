//! `engine`, the program users run: a front to the engine program beside it
//! (`engine-core`, `main.rs`).
//!
//! A one-shot `engine sandbox exec` that a daemon serves (`engine sandbox daemon`) is done
//! here: parse, ask the daemon, print its answer. This program is small (no runtime, no
//! trainer, no servers), so its start costs what a small C program's does, where the engine
//! program's dynamic loader alone took longer than the rest of a served one-shot's client
//! (engine/oneshot/mod.rs). Everything else (every other command, a one-shot with
//! `--no-daemon`, a log filter above `warn`, input the daemon must not see, or one no daemon
//! serves) is handed over, unchanged, to the engine program: this process `execve`s it with
//! the same arguments (`argv[0]` too) and environment, so its pid, signals, exit status and
//! output are that program's, as if it had been run directly.

// Shared with the engine program, which uses the parts this program leaves out (the daemon's
// side of the wire, the log filter, the exit statuses of a sandbox it runs itself).
#[allow(dead_code)]
mod oneshot;

use oneshot::args::OneShotCli;
use oneshot::protocol::ExeId;
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

fn main() {
    let args: Vec<OsString> = std::env::args_os().collect();
    // (For `engine bench sandbox`, which times this program's one-shots: of this build?)
    if args.len() == 2 && args[1] == "__front-build" {
        println!("{}", oneshot::BUILD);
        return;
    }
    let core = core_path();
    if let Some(code) = serve(&args, &core) {
        std::process::exit(code);
    }
    let Some(core) = core else {
        eprintln!("engine: cannot find this program's own path (/proc/self/exe)");
        std::process::exit(oneshot::outcome::EXIT_SANDBOX_FAILURE);
    };
    let mut cmd = std::process::Command::new(&core);
    if let Some(arg0) = args.first() {
        cmd.arg0(arg0);
    }
    let e = cmd
        .args(args.iter().skip(1))
        .env(oneshot::FRONT_BUILD_ENV, oneshot::BUILD)
        .exec();
    let hint = if e.kind() == std::io::ErrorKind::NotFound {
        " (`cargo build` builds it beside `engine`)"
    } else {
        ""
    };
    eprintln!(
        "engine: cannot run the engine program {}: {e}{hint}",
        core.display()
    );
    std::process::exit(oneshot::outcome::EXIT_SANDBOX_FAILURE);
}

/// The engine program beside this one.
fn core_path() -> Option<PathBuf> {
    Some(std::env::current_exe().ok()?.with_file_name(oneshot::CORE))
}

/// The exit status of a one-shot a daemon served, or `None` when the engine program must take
/// the command line: anything but a valid `engine sandbox exec` that a daemon answered. Once a
/// request was sent, its answer (or its loss) is reported here: a command is never run twice.
fn serve(args: &[OsString], core: &Option<PathBuf>) -> Option<i32> {
    let o = OneShotCli::parse(args)?;
    // The engine program decides what the filter lets through (and logs what it does).
    if o.exec.no_daemon || !matches!(o.logging.log.as_str(), "warn" | "error" | "off") {
        return None;
    }
    // Bad input is reported by the engine program, in its words.
    let (cfg, timeout) = o.exec.checked().ok()?;
    let exe = match core {
        Some(c) => ExeId::of(c),
        None => Err(std::io::Error::from(std::io::ErrorKind::NotFound)),
    };
    let outcome = oneshot::client::ask(exe, &o.exec.opts, &cfg, timeout, &o.exec.cmd, exit_at_once)
        .ok()??;
    Some(match outcome.report(&o.exec.opts.memory, timeout) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("engine: {e}");
            oneshot::outcome::EXIT_SANDBOX_FAILURE
        }
    })
}

/// From here on SIGINT, SIGTERM and SIGHUP end this process at once with 128 + the signal,
/// as they end the engine program's one-shot: the daemon kills the command when its client
/// goes. (Handing over to the engine program resets them: `execve`.)
fn exit_at_once() {
    extern "C" fn on_signal(sig: libc::c_int) {
        // SAFETY: _exit(2) is async-signal-safe.
        unsafe { libc::_exit(128 + sig) };
    }
    let handler = on_signal as extern "C" fn(libc::c_int);
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only calls _exit; `signal` installs it with SA_RESTART
        // semantics (glibc's BSD `signal`).
        unsafe { libc::signal(sig, handler as libc::sighandler_t) };
    }
}
