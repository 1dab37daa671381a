//! `engine`, the program users run: a front to the engine program beside it (`engine-core`,
//! `main.rs`).
//!
//! A one-shot `engine sandbox exec` that a daemon serves (`engine sandbox daemon`) is done
//! here: parse, ask the daemon, print its answer. This program is small (no runtime, no
//! trainer, no servers), so its start costs about what a small C program's does, where the
//! engine program's dynamic loader took about half of a served one-shot's client
//! (engine/oneshot/mod.rs). Everything else (every other command, a one-shot with
//! `--no-daemon`, a log filter other than `warn`, `error` or `off`, input the engine program
//! rejects, or one no daemon takes) is handed over, unchanged, to the engine program: this
//! process `execve`s it with the same arguments (`argv[0]` too), environment (plus the
//! front's build, which the engine program removes) and signal mask, so its pid, exit status
//! and output are that program's, as if it had been run directly.

// Shared with the engine program, which uses the parts this program leaves out (the daemon's
// side of the wire, the log filter, the exit statuses of a sandbox it runs itself).
#[allow(dead_code)]
mod oneshot;

use oneshot::args::OneShotCli;
use oneshot::client::Asked;
use oneshot::outcome::{signal_exit_status, signal_name, EXIT_SANDBOX_FAILURE};
use oneshot::protocol::ExeId;
use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

fn main() {
    let args: Vec<OsString> = std::env::args_os().collect();
    // (For `engine bench sandbox`, which times this program's one-shots: of this build?)
    if args.len() == 2 && args[1] == "__front-build" {
        println!("{}", oneshot::BUILD);
        return;
    }
    // Beside this program's file (without /proc, beside the path it was run by).
    let core = std::env::current_exe()
        .ok()
        .or_else(|| {
            let arg0 = Path::new(args.first()?);
            (arg0.components().count() > 1).then(|| arg0.to_path_buf())
        })
        .map(|me| me.with_file_name(oneshot::CORE));
    if let Some(code) = serve(&args, core.as_deref()) {
        std::process::exit(code);
    }
    let Some(core) = core else {
        eprintln!(
            "engine: cannot find the engine program: neither /proc/self/exe nor the command's \
             path says where this program is"
        );
        std::process::exit(EXIT_SANDBOX_FAILURE);
    };
    let e = hand_over(&core, &args);
    let hint = if e.kind() == std::io::ErrorKind::NotFound {
        " (`cargo build` builds it beside `engine`)"
    } else {
        ""
    };
    eprintln!(
        "engine: cannot run the engine program {}: {e}{hint}",
        core.display()
    );
    std::process::exit(EXIT_SANDBOX_FAILURE);
}

/// The exit status of a one-shot a daemon served, or `None` when the engine program must take
/// the command line: anything but a valid `engine sandbox exec` that a daemon took. Once the
/// daemon took the request, its answer (or its loss) is reported here: a command is never
/// run twice.
fn serve(args: &[OsString], core: Option<&Path>) -> Option<i32> {
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
    // From the request's sending until the daemon answers, a signal ends this process at
    // once, as it ends the engine program's one-shot: nothing to tear down, and the daemon
    // kills the command when its client goes. (Before, signals have their default action:
    // one then ends this process by the signal, where the engine program, past its own
    // start, would exit with 128 + the signal. A hand-over's `execve` resets the handlers.)
    let asked = oneshot::client::ask(
        exe,
        &o.exec.opts,
        &cfg,
        timeout,
        &o.exec.cmd,
        handle_signals,
    );
    let Ok(Asked::Answered(outcome)) = asked else {
        return None;
    };
    // The answer is printed whole; a signal meanwhile then ends the process as the engine
    // program's watcher would.
    EXIT_AT_ONCE.store(false, Ordering::SeqCst);
    let reported = outcome.report(&o.exec.opts.memory, timeout);
    // A signal meanwhile wins, as the engine program's watcher does (before its error).
    Some(match (SIGNAL.load(Ordering::SeqCst), reported) {
        (0, Ok(code)) => code,
        (0, Err(e)) => {
            eprintln!("engine: {e}");
            EXIT_SANDBOX_FAILURE
        }
        (sig, _) => {
            eprintln!("engine: {}: sandboxes torn down", signal_name(sig));
            signal_exit_status(sig)
        }
    })
}

/// While set, a signal ends the process at once with 128 + the signal; else it is recorded in
/// [`SIGNAL`].
static EXIT_AT_ONCE: AtomicBool = AtomicBool::new(true);
static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    if EXIT_AT_ONCE.load(Ordering::SeqCst) {
        // SAFETY: _exit(2) is async-signal-safe.
        unsafe { libc::_exit(signal_exit_status(sig)) };
    }
    let _ = SIGNAL.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst);
}

/// SIGINT, SIGTERM and SIGHUP go to [`on_signal`].
fn handle_signals() {
    let handler = on_signal as extern "C" fn(libc::c_int);
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only uses atomics and _exit; `signal` installs it with
        // SA_RESTART semantics (BSD `signal`, in glibc and in musl, for the static front).
        unsafe { libc::signal(sig, handler as libc::sighandler_t) };
    }
}

/// `execve` the engine program with `args` and this environment, plus this build (returns
/// only on failure). `execv` itself: the environment and the signal state go as they are
/// (`Command::exec` would copy the environment and set SIGPIPE back to its default, which the
/// engine program's runtime ignores again either way).
fn hand_over(core: &Path, args: &[OsString]) -> std::io::Error {
    let invalid = || std::io::Error::from(std::io::ErrorKind::InvalidInput);
    let Ok(path) = CString::new(core.as_os_str().as_bytes()) else {
        return invalid();
    };
    let Ok(argv) = args
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<Vec<_>, _>>()
    else {
        return invalid();
    };
    let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    // Single-threaded: nothing reads the environment meanwhile.
    std::env::set_var(oneshot::FRONT_BUILD_ENV, oneshot::BUILD);
    // SAFETY: `path` and every element of `ptrs` are NUL-terminated strings that outlive the
    // call, and `ptrs` ends with a null pointer.
    unsafe { libc::execv(path.as_ptr(), ptrs.as_ptr()) };
    std::io::Error::last_os_error()
}
