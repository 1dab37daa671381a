//! Reads that ride on the agent's command: what the verifier and the observation asked of the
//! sandbox after the last command is asked again along with the next one
//! ([`sandbox::protocol::ExecRequest::looks`]), so that their answers come back in the
//! command's own exchange instead of one round trip each. An episode's reset carries them too
//! (`RunningInstance::restart`, unless start steps follow it): the start state's verdict and
//! observation ask mostly what the last step's asked, the overview of the start directory
//! instead of the last step's ([`Looks::take_asked_for_reset`]).
//!
//! Init answers them at the moment the command has ended, where their own requests would come
//! one round trip later. What the kernel finishes after a command's end is not in them yet: a
//! process killed by the command dies when it is next scheduled, and what it held is freed
//! then. So reads of processes (`/proc`) and of the disk accounting (`health`) are never sent
//! ahead: they keep their own request, after the command, as before (the observation's
//! overview is, with the writable layer's usage it shows the agent). An answer is used once,
//! by the same request, in the verdict and the observation of that step. None is used once
//! anything may have changed the sandbox: a request that changes it, the verifier's first TCP
//! request to a service (which may change what the service holds), a confirmation.

use sandbox::protocol::{DirEntry, ExecRequest, ExecResult, FileStat, Health, Look, Overview};
use sandbox::protocol::{Response, MAX_LOOKS};
use sandbox::{SandboxError, SandboxOps};
use std::sync::atomic::{AtomicBool, Ordering};

/// Bytes that the recorded reads may ask for together (their `max_bytes`), so that a
/// command's answer stays far below the protocol's frame limit.
pub const READ_BUDGET: u64 = 32 << 20;

/// What was asked after the last command or reset, and the answers that came with it.
#[derive(Debug, Default)]
pub struct Looks {
    /// Asked since the last command or reset, in order, each once: sent along with the next.
    asked: Vec<Look>,
    /// Answers that came with the last command or reset and are not used yet.
    answers: Vec<(Look, Response)>,
    /// Requests answered from what came with a command or reset, so far (a round trip saved
    /// each).
    answered: u64,
    /// Whether the verifier of the last command's step made contact with a service.
    contacted: bool,
}

impl Looks {
    /// Send what was asked after the last command along with `req`, and start recording
    /// afresh.
    pub fn attach(&mut self, req: &mut ExecRequest) {
        req.looks = self.take_asked();
    }

    /// What was asked since the last command or reset, to send along with the next one; the
    /// answers left are dropped and recording starts afresh.
    pub fn take_asked(&mut self) -> Vec<Look> {
        self.answers.clear();
        self.contacted = false;
        std::mem::take(&mut self.asked)
    }

    /// [`Looks::take_asked`] for a reset: the observation's overview, of `ended_in` (the
    /// directory the last step ended in), is asked of `start_dir` (the one the next episode
    /// starts in). An overview of another directory is asked as it was.
    pub fn take_asked_for_reset(&mut self, ended_in: &str, start_dir: &str) -> Vec<Look> {
        let mut asked = self.take_asked();
        for look in &mut asked {
            if let Look::Overview { path, .. } = look {
                if path == ended_in {
                    path.clear();
                    path.push_str(start_dir);
                }
            }
        }
        asked
    }

    /// Keep the answers that came with `res` (none when the backend does not answer looks).
    pub fn received(&mut self, sent: Vec<Look>, res: &mut ExecResult) {
        self.keep(sent, std::mem::take(&mut res.answers));
    }

    /// Keep `answers` to the looks `sent` along with a command or a reset; none unless there is
    /// one for each.
    pub fn keep(&mut self, sent: Vec<Look>, answers: Vec<Response>) {
        self.answers = if answers.len() == sent.len() {
            sent.into_iter().zip(answers).collect()
        } else {
            Vec::new()
        };
    }

    /// Forget every answer and what was asked (the sandbox changed: a command that brings
    /// none, a reset followed by start steps).
    pub fn clear(&mut self) {
        self.asked.clear();
        self.answers.clear();
        self.contacted = false;
    }

    /// Forget the answers left unused.
    pub fn drop_answers(&mut self) {
        self.answers.clear();
    }

    /// After the verifier's reads: the answers left unused are dropped, but for the overview
    /// the observation will read, unless the verifier made contact with a service (which may
    /// have changed the sandbox).
    pub fn after_verify(&mut self, contact: bool) {
        self.contacted |= contact;
        self.answers
            .retain(|(l, _)| !contact && matches!(l, Look::Overview { .. }));
    }

    /// Whether the verifier made contact with a service since the last command.
    pub fn contacted(&self) -> bool {
        self.contacted
    }

    fn record(&mut self, look: &Look) {
        if !sent_ahead(look) || self.asked.len() >= MAX_LOOKS || self.asked.contains(look) {
            return;
        }
        if let Look::ReadFile { max_bytes, .. } = look {
            let asked: u64 = self
                .asked
                .iter()
                .map(|l| match l {
                    Look::ReadFile { max_bytes, .. } => *max_bytes,
                    _ => 0,
                })
                .sum();
            if asked.saturating_add(*max_bytes) > READ_BUDGET {
                return;
            }
        }
        self.asked.push(look.clone());
    }

    fn take(&mut self, look: &Look) -> Option<Response> {
        let i = self.answers.iter().position(|(l, _)| l == look)?;
        self.answered += 1;
        Some(self.answers.remove(i).1)
    }

    /// Requests answered from what came with a command or reset, so far.
    pub fn answered(&self) -> u64 {
        self.answered
    }
}

/// Whether `look` may be sent ahead: not a read of processes (`/proc`) or of the disk
/// accounting (`health`), which lag behind the command's end (see the module's text).
fn sent_ahead(look: &Look) -> bool {
    // The overview always (see the module's text); otherwise no read of processes
    // ([`Look::reads_processes`]; a symlink into `/proc` is not seen there: such a read is still
    // the state at the command's end).
    matches!(look, Look::Overview { .. }) || !look.reads_processes()
}

/// A sandbox whose read-only requests are answered from [`Looks`] where they came with the
/// last command or reset, and recorded for the next; any other request goes to the sandbox and ends
/// both (the sandbox may have changed).
pub struct Answering<'a> {
    inner: &'a mut dyn SandboxOps,
    looks: &'a mut Looks,
    /// Set once a request that may change the sandbox went through.
    changed: bool,
    /// Set from outside when the sandbox may have changed otherwise (a verifier's TCP request
    /// to a service: `SandboxProbe::contact` in `probe.rs`).
    contact: Option<&'a AtomicBool>,
}

impl<'a> Answering<'a> {
    pub fn new(
        inner: &'a mut dyn SandboxOps,
        looks: &'a mut Looks,
        contact: Option<&'a AtomicBool>,
    ) -> Self {
        Self {
            inner,
            looks,
            changed: false,
            contact,
        }
    }

    /// The answer to `look`: the one that came with the command when there is one, else the
    /// sandbox's own.
    fn look<T>(
        &mut self,
        look: Look,
        answer: fn(Response) -> Result<T, SandboxError>,
        live: impl FnOnce(&mut dyn SandboxOps) -> Result<T, SandboxError>,
    ) -> Result<T, SandboxError> {
        if self.changed || self.contact.is_some_and(|c| c.load(Ordering::Relaxed)) {
            return live(&mut *self.inner);
        }
        self.looks.record(&look);
        match self.looks.take(&look) {
            Some(r) => answer(r),
            None => live(&mut *self.inner),
        }
    }

    fn change(&mut self) -> &mut dyn SandboxOps {
        self.changed = true;
        self.looks.clear();
        &mut *self.inner
    }
}

impl SandboxOps for Answering<'_> {
    fn exec(&mut self, req: &ExecRequest) -> Result<sandbox::ExecResult, SandboxError> {
        self.change().exec(req)
    }
    fn read_file(&mut self, path: &str, max_bytes: u64) -> Result<(Vec<u8>, bool), SandboxError> {
        let look = Look::ReadFile {
            path: path.into(),
            max_bytes,
            nofollow: false,
        };
        self.look(look, sandbox::sandbox::file_answer, |s| {
            s.read_file(path, max_bytes)
        })
    }
    fn read_file_nofollow(
        &mut self,
        path: &str,
        max_bytes: u64,
    ) -> Result<(Vec<u8>, bool), SandboxError> {
        let look = Look::ReadFile {
            path: path.into(),
            max_bytes,
            nofollow: true,
        };
        self.look(look, sandbox::sandbox::file_answer, |s| {
            s.read_file_nofollow(path, max_bytes)
        })
    }
    fn write_file(&mut self, path: &str, data: &[u8], mode: u32) -> Result<(), SandboxError> {
        self.change().write_file(path, data, mode)
    }
    fn stat(&mut self, path: &str) -> Result<FileStat, SandboxError> {
        let look = Look::Stat { path: path.into() };
        self.look(look, sandbox::sandbox::stat_answer, |s| s.stat(path))
    }
    fn list_dir(&mut self, path: &str) -> Result<Vec<DirEntry>, SandboxError> {
        let look = Look::ListDir { path: path.into() };
        self.look(look, sandbox::sandbox::dir_answer, |s| s.list_dir(path))
    }
    fn overview(&mut self, path: &str, max_entries: u32) -> Result<Overview, SandboxError> {
        let look = Look::Overview {
            path: path.into(),
            max_entries,
        };
        self.look(look, sandbox::sandbox::overview_answer, |s| {
            s.overview(path, max_entries)
        })
    }
    fn kill_all(&mut self) -> Result<(), SandboxError> {
        self.change().kill_all()
    }
    fn reset(&mut self) -> Result<(), SandboxError> {
        self.change().reset()
    }
    fn snapshot(&mut self) -> Result<u32, SandboxError> {
        self.change().snapshot()
    }
    fn rollback(&mut self, snapshot: u32) -> Result<(), SandboxError> {
        self.change().rollback(snapshot)
    }
    fn health(&mut self) -> Result<Health, SandboxError> {
        self.look(Look::Health, sandbox::sandbox::health_answer, |s| {
            s.health()
        })
    }
    fn is_alive(&self) -> bool {
        self.inner.is_alive()
    }
    fn pids_usage(&self) -> (u64, Option<u64>) {
        self.inner.pids_usage()
    }
    fn init_pid(&self) -> i32 {
        self.inner.init_pid()
    }
    fn export_diff(
        &self,
        dst: &std::path::Path,
        max_bytes: u64,
    ) -> Result<Option<u64>, SandboxError> {
        self.inner.export_diff(dst, max_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(answers: Vec<Response>) -> ExecResult {
        ExecResult {
            termination: sandbox::Termination::Exited(0),
            stdout: vec![],
            stderr: vec![],
            stdout_truncated: false,
            stderr_truncated: false,
            duration_us: 0,
            oom_killed: false,
            pid: 0,
            answers,
        }
    }

    fn read(path: &str, max_bytes: u64) -> Look {
        Look::ReadFile {
            path: path.into(),
            max_bytes,
            nofollow: true,
        }
    }

    #[test]
    fn what_was_asked_is_sent_once_each_in_order_within_the_bounds() {
        let mut l = Looks::default();
        l.record(&read("/a", 10));
        let overview = Look::Overview {
            path: "/root".into(),
            max_entries: 64,
        };
        l.record(&overview);
        l.record(&read("/a", 10));
        // Processes and the disk accounting lag behind a command's end: never sent ahead.
        l.record(&Look::Health);
        l.record(&read("/proc/7/stat", 4096));
        l.record(&Look::ListDir {
            path: "//./proc".into(),
        });
        l.record(&read("/big", READ_BUDGET)); // over the budget with /a: left to the sandbox
        for i in 0..MAX_LOOKS {
            l.record(&Look::Stat {
                path: format!("/s{i}"),
            });
        }
        let mut req = ExecRequest::shell("true");
        l.attach(&mut req);
        assert_eq!(req.looks.len(), MAX_LOOKS);
        assert_eq!(req.looks[..2], [read("/a", 10), overview]);
        assert!(!req.looks.contains(&read("/big", READ_BUDGET)));
        let mut next = ExecRequest::shell("true");
        l.attach(&mut next);
        assert!(
            next.looks.is_empty(),
            "recording starts afresh after each command"
        );
    }

    #[test]
    fn a_reset_asks_the_overview_of_the_start_directory_and_the_rest_as_asked() {
        let mut l = Looks::default();
        let overview = |path: &str| Look::Overview {
            path: path.into(),
            max_entries: 64,
        };
        l.record(&read("/a", 10));
        l.record(&overview("/tmp/elsewhere"));
        l.record(&overview("/etc"));
        let sent = l.take_asked_for_reset("/tmp/elsewhere", "/srv/app");
        assert_eq!(
            sent,
            [read("/a", 10), overview("/srv/app"), overview("/etc")]
        );
        assert!(
            l.take_asked_for_reset("/tmp/elsewhere", "/srv/app")
                .is_empty(),
            "asked once"
        );
    }

    #[test]
    fn an_answer_serves_only_its_own_look_once_and_a_short_reply_keeps_none() {
        let mut l = Looks::default();
        let sent = vec![read("/a", 10), Look::Stat { path: "/b".into() }];
        let answer = Response::File {
            data: b"x".to_vec(),
            truncated: false,
        };
        let mut res = result(vec![answer.clone(), Response::Ok]);
        l.received(sent.clone(), &mut res);
        assert!(res.answers.is_empty());
        assert_eq!(l.take(&read("/a", 11)), None, "another max is another look");
        assert_eq!(l.take(&read("/a", 10)), Some(answer));
        assert_eq!(l.take(&read("/a", 10)), None, "used once");
        let mut short = result(vec![Response::Ok]);
        l.received(sent, &mut short);
        assert_eq!(l.take(&Look::Stat { path: "/b".into() }), None);
    }

    /// A sandbox that answers every read with how many requests it has had.
    #[derive(Default)]
    struct Counting(u64);

    impl SandboxOps for Counting {
        fn exec(&mut self, _: &ExecRequest) -> Result<ExecResult, SandboxError> {
            self.0 += 1;
            Ok(result(vec![]))
        }
        fn read_file(&mut self, _: &str, _: u64) -> Result<(Vec<u8>, bool), SandboxError> {
            self.0 += 1;
            Ok((self.0.to_string().into_bytes(), false))
        }
        fn read_file_nofollow(&mut self, p: &str, m: u64) -> Result<(Vec<u8>, bool), SandboxError> {
            self.read_file(p, m)
        }
        fn write_file(&mut self, _: &str, _: &[u8], _: u32) -> Result<(), SandboxError> {
            Err(SandboxError::Dead)
        }
        fn stat(&mut self, _: &str) -> Result<FileStat, SandboxError> {
            Err(SandboxError::Dead)
        }
        fn list_dir(&mut self, _: &str) -> Result<Vec<DirEntry>, SandboxError> {
            Err(SandboxError::Dead)
        }
        fn kill_all(&mut self) -> Result<(), SandboxError> {
            Err(SandboxError::Dead)
        }
        fn reset(&mut self) -> Result<(), SandboxError> {
            Err(SandboxError::Dead)
        }
        fn snapshot(&mut self) -> Result<u32, SandboxError> {
            Err(SandboxError::Dead)
        }
        fn rollback(&mut self, _: u32) -> Result<(), SandboxError> {
            Err(SandboxError::Dead)
        }
        fn health(&mut self) -> Result<Health, SandboxError> {
            Err(SandboxError::Dead)
        }
        fn is_alive(&self) -> bool {
            true
        }
        fn pids_usage(&self) -> (u64, Option<u64>) {
            (0, None)
        }
        fn init_pid(&self) -> i32 {
            0
        }
    }

    fn with_answers(n: usize) -> Looks {
        let mut l = Looks::default();
        let sent: Vec<Look> = (0..n).map(|i| read(&format!("/{i}"), 10)).collect();
        let answers = (0..n)
            .map(|_| Response::File {
                data: b"ahead".to_vec(),
                truncated: false,
            })
            .collect();
        l.received(sent, &mut result(answers));
        l
    }

    #[test]
    fn answers_stop_at_a_change_or_a_contact_and_are_recorded_until_then() {
        let (mut sb, contact) = (Counting::default(), AtomicBool::new(false));
        let mut looks = with_answers(3);
        let mut a = Answering::new(&mut sb, &mut looks, Some(&contact));
        assert_eq!(a.read_file_nofollow("/0", 10).unwrap().0, b"ahead");
        assert_eq!(a.read_file_nofollow("/0", 10).unwrap().0, b"1", "once");
        contact.store(true, Ordering::Relaxed);
        assert_eq!(
            a.read_file_nofollow("/1", 10).unwrap().0,
            b"2",
            "after a contact"
        );
        contact.store(false, Ordering::Relaxed);
        a.exec(&ExecRequest::shell("true")).unwrap();
        assert_eq!(
            a.read_file_nofollow("/2", 10).unwrap().0,
            b"4",
            "after a change"
        );
        assert!(a.changed);
        let mut next = ExecRequest::shell("true");
        looks.attach(&mut next);
        assert!(next.looks.is_empty(), "a change forgets what was asked");
        let mut looks = with_answers(1);
        let mut a = Answering::new(&mut sb, &mut looks, Some(&contact));
        a.read_file_nofollow("/0", 10).unwrap();
        a.read_file("/9", 5).unwrap();
        let mut next = ExecRequest::shell("true");
        looks.attach(&mut next);
        assert_eq!(
            next.looks,
            [
                read("/0", 10),
                Look::ReadFile {
                    path: "/9".into(),
                    max_bytes: 5,
                    nofollow: false
                }
            ]
        );
    }

    #[test]
    fn after_the_verifier_only_the_overview_is_kept_and_not_after_a_contact() {
        let overview = Look::Overview {
            path: "/root".into(),
            max_entries: 64,
        };
        let sent = vec![read("/a", 10), overview.clone()];
        let answers = || {
            vec![
                Response::Ok,
                Response::Overview(Overview {
                    entries: None,
                    upper_bytes: 1,
                }),
            ]
        };
        let mut l = Looks::default();
        l.received(sent.clone(), &mut result(answers()));
        l.after_verify(false);
        assert_eq!(l.take(&read("/a", 10)), None);
        assert!(l.take(&overview).is_some());
        assert!(!l.contacted());
        l.received(sent, &mut result(answers()));
        l.after_verify(true);
        assert_eq!(l.take(&overview), None);
        assert!(
            l.contacted(),
            "the observation asks afresh, without recording"
        );
        l.attach(&mut ExecRequest::shell("true"));
        assert!(!l.contacted(), "until the next command");
    }
}
