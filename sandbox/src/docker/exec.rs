//! One command in a container: `POST /containers/{id}/exec` and `/exec/{id}/start` attached,
//! stdin written while both outputs are read (neither side can block the other), each output
//! kept up to the cap and drained past it, and at the deadline the command's process tree
//! killed from the host (Docker has no way to stop an exec).

use super::{host, Client, DockerError};
use crate::protocol::{Command, ExecRequest, ExecResult, Termination};
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use futures_util::StreamExt;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

/// How long the output may still flow once the command's tree was killed at its deadline
/// (a daemon it started keeps the pipes open; the exec is then abandoned).
const DRAIN_AFTER_KILL: Duration = Duration::from_secs(2);

/// One output stream, kept up to a cap.
#[derive(Default)]
struct Capped {
    data: Vec<u8>,
    truncated: bool,
}

impl Capped {
    fn push(&mut self, bytes: &[u8], cap: u64) {
        let room = (cap as usize).saturating_sub(self.data.len());
        if bytes.len() > room {
            self.truncated = true;
        }
        self.data.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }
}

/// The argv Docker runs: a shell command goes through the image's `/bin/sh -c` (with its
/// epilogue: this backend has no path without the shell).
fn argv(cmd: &Command, epilogue: Option<&str>) -> Vec<String> {
    match cmd {
        Command::Argv(a) => a.clone(),
        Command::Shell(s) => vec![
            "/bin/sh".into(),
            "-c".into(),
            ExecRequest::shell_text(s, epilogue),
        ],
    }
}

/// Run `req` in container `id` whose init and keep-alive have host pids `init_pid` and
/// `keep_pid`; `env` is used when the request has none.
pub(crate) fn run(
    client: &Client,
    id: &str,
    (init_pid, keep_pid): (i32, i32),
    req: &ExecRequest,
    env: &[String],
) -> Result<ExecResult, DockerError> {
    let started = Instant::now();
    let argv = argv(&req.command, req.shell_epilogue.as_deref());
    if argv.is_empty() {
        return Err(DockerError::Container {
            id: id.to_string(),
            reason: "exec of an empty argv".into(),
        });
    }
    let oom_before = host::oom_kills(init_pid);
    let env = req.env.clone().unwrap_or_else(|| env.to_vec());
    let user = req.user.map(|(u, g)| format!("{u}:{g}"));
    let api =
        |what: &str, e: bollard::errors::Error| DockerError::api(format!("{what} in {id}"), e);
    let docker = client.docker();
    let timeout = Duration::from_millis(req.timeout_ms);
    client.block_on(async {
        let exec = docker
            .create_exec(
                id,
                CreateExecOptions::<String> {
                    attach_stdin: Some(!req.stdin.is_empty()),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    env: Some(env),
                    cmd: Some(argv),
                    user,
                    working_dir: Some(req.cwd.clone()),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| api("exec create", e))?;
        let start = docker
            .start_exec(
                &exec.id,
                Some(StartExecOptions {
                    detach: false,
                    tty: false,
                    output_capacity: None,
                }),
            )
            .await
            .map_err(|e| api("exec start", e))?;
        let StartExecResults::Attached {
            mut output,
            mut input,
        } = start
        else {
            return Err(DockerError::Container {
                id: id.to_string(),
                reason: "the daemon started the exec detached".into(),
            });
        };
        let stdin = req.stdin.clone();
        let feed = async move {
            if !stdin.is_empty() {
                // A command that exits without reading its input closes the pipe: not an error.
                let _ = input.write_all(&stdin).await;
                let _ = input.shutdown().await;
            }
        };
        let cap = req.output_cap;
        let deadline = tokio::time::Instant::now() + timeout;
        let collect = async {
            let (mut out, mut err) = (Capped::default(), Capped::default());
            let mut timed_out = false;
            let mut drain_until = None;
            loop {
                let until = drain_until.unwrap_or(deadline);
                match tokio::time::timeout_at(until, output.next()).await {
                    Ok(Some(Ok(
                        LogOutput::StdOut { message } | LogOutput::Console { message },
                    ))) => out.push(&message, cap),
                    Ok(Some(Ok(LogOutput::StdErr { message }))) => err.push(&message, cap),
                    Ok(Some(Ok(LogOutput::StdIn { .. }))) => {}
                    Ok(Some(Err(e))) => return Err(api("exec output", e)),
                    Ok(None) => break,
                    Err(_) if drain_until.is_some() => break,
                    Err(_) => {
                        timed_out = true;
                        let pid = docker
                            .inspect_exec(&exec.id)
                            .await
                            .ok()
                            .and_then(|i| i.pid)
                            .unwrap_or(0) as i32;
                        if pid > 0 {
                            host::kill_tree(init_pid, keep_pid, pid);
                        }
                        drain_until = Some(tokio::time::Instant::now() + DRAIN_AFTER_KILL);
                    }
                }
            }
            Ok::<_, DockerError>((out, err, timed_out))
        };
        let ((), collected) = tokio::join!(feed, collect);
        let (out, err, timed_out) = collected?;
        let info = docker
            .inspect_exec(&exec.id)
            .await
            .map_err(|e| api("exec inspect", e))?;
        let termination = if timed_out {
            Termination::TimedOut
        } else {
            match info.exit_code {
                Some(c) => Termination::Exited(c as i32),
                None => {
                    return Err(DockerError::Container {
                        id: id.to_string(),
                        reason: "the daemon reported no exit code for a finished exec".into(),
                    })
                }
            }
        };
        let killed = matches!(termination, Termination::Exited(137));
        Ok(ExecResult {
            termination,
            stdout: out.data,
            stderr: err.data,
            stdout_truncated: out.truncated,
            stderr_truncated: err.truncated,
            duration_us: started.elapsed().as_micros() as u64,
            oom_killed: killed && host::oom_kills(init_pid) > oom_before,
            pid: 0,
            answers: Vec::new(),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_are_capped_and_flagged() {
        let mut c = Capped::default();
        c.push(b"abc", 5);
        assert!(!c.truncated);
        c.push(b"defg", 5);
        assert_eq!(c.data, b"abcde");
        assert!(c.truncated);
    }

    #[test]
    fn a_shell_command_goes_through_the_images_shell_with_its_epilogue_as_the_exit_trap() {
        assert_eq!(
            argv(&Command::Shell("x".into()), None),
            ["/bin/sh", "-c", "x"]
        );
        // No path without the shell here: the epilogue always runs.
        assert_eq!(
            argv(&Command::Shell("x".into()), Some("e"))[2],
            "trap 'e' EXIT; x"
        );
    }
}
