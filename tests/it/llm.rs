//! The language-model agent against a fake OpenAI-compatible chat-completions server on
//! loopback, started by each test and scripted per request: a solve with a rate limit, an
//! unreadable body and a reply without a command on the way; then an endpoint that always
//! fails, one that hangs past the timeout, one whose replies never hold a command, one that
//! refuses the key. Each ends as the agent's failure with its transcript, never as the
//! environment's; `engine episode --agent llm` and `engine run` keep the transcript. A long
//! episode's requests stay within the context budget; a model acting through `run_command`
//! tool calls solves, and its malformed calls are its failures.

use crate::common;

use engine::agents::{LlmAgent, LlmConfig};
use engine::env::{Env, EnvConfig};
use engine::instance::Plan;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// What the fake server answers to one request.
#[derive(Clone)]
enum Answer {
    /// 200 with a chat completion of this text (usage: 10 prompt, 5 completion tokens).
    Says(String),
    /// This status, with `Retry-After` when given.
    Status(u16, Option<&'static str>),
    /// 200 with this raw body.
    Body(&'static str),
    /// 200 with this text (null when empty) and these `tool_calls`.
    Calls(&'static str, serde_json::Value),
    /// Never answer (until the server stops).
    Hang,
}

/// A reply calling `run_command` with `cmd`, as call `id`.
fn tool_call(id: &str, cmd: &str) -> Answer {
    let args = serde_json::json!({ "command": cmd }).to_string();
    Answer::Calls(
        "",
        serde_json::json!([{"id": id, "type": "function",
                            "function": {"name": "run_command", "arguments": args}}]),
    )
}

fn says(content: impl Into<String>) -> Answer {
    Answer::Says(content.into())
}

fn command(cmd: &str) -> Answer {
    says(format!("I will run this.\n```sh\n{cmd}\n```"))
}

/// A request the server saw: its head (lowercased) and its JSON body.
#[derive(Clone)]
struct Seen {
    head: String,
    body: serde_json::Value,
}

type Script = dyn Fn(usize) -> Answer + Send + Sync;

/// The fake server: answers request `n` with `script(n)`; stopped and joined when dropped.
struct FakeChat {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl FakeChat {
    fn start(script: impl Fn(usize) -> Answer + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let script: Arc<Script> = Arc::new(script);
        let accept = {
            let (seen, stop) = (seen.clone(), stop.clone());
            std::thread::spawn(move || {
                let count = Arc::new(AtomicUsize::new(0));
                let mut handlers = Vec::new();
                for conn in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    let (seen, stop, script, count) =
                        (seen.clone(), stop.clone(), script.clone(), count.clone());
                    handlers.push(std::thread::spawn(move || {
                        serve(conn, &seen, &stop, &*script, &count)
                    }));
                }
                for h in handlers {
                    let _ = h.join();
                }
            })
        };
        Self {
            addr,
            seen,
            stop,
            accept: Some(accept),
        }
    }

    fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// A config for this server that retries fast.
    fn config(&self) -> LlmConfig {
        let mut c = LlmConfig::new(self.base_url(), "fake-model");
        c.backoff = "1ms".into();
        c.max_wait = "20ms".into();
        c.timeout = "5s".into();
        c
    }
}

impl Drop for FakeChat {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop.
        let _ = TcpStream::connect(self.addr);
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

/// One connection: one request, one answer, then close.
fn serve(
    mut conn: TcpStream,
    seen: &Mutex<Vec<Seen>>,
    stop: &AtomicBool,
    script: &Script,
    count: &AtomicUsize,
) {
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return, // the wake-up connection, or a client gone
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().unwrap());
    while buf.len() < head_end + len {
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let body = serde_json::from_slice(&buf[head_end..head_end + len]).unwrap();
    let n = {
        let mut s = seen.lock().unwrap();
        s.push(Seen { head, body });
        count.fetch_add(1, Ordering::SeqCst)
    };
    let (status, extra, body) = match script(n) {
        Answer::Says(text) => (
            200,
            String::new(),
            serde_json::json!({
                "id": format!("c{n}"), "object": "chat.completion", "model": "fake-model",
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
            })
            .to_string(),
        ),
        Answer::Status(code, after) => (
            code,
            after.map_or(String::new(), |a| format!("retry-after: {a}\r\n")),
            r#"{"error":{"message":"scripted"}}"#.to_string(),
        ),
        Answer::Body(b) => (200, String::new(), b.to_string()),
        Answer::Calls(text, calls) => (
            200,
            String::new(),
            serde_json::json!({
                "id": format!("c{n}"), "object": "chat.completion", "model": "fake-model",
                "choices": [{"index": 0, "finish_reason": "tool_calls",
                             "message": {"role": "assistant",
                                         "content": if text.is_empty() { serde_json::Value::Null } else { text.into() },
                                         "tool_calls": calls}}],
            })
            .to_string(),
        ),
        Answer::Hang => {
            while !stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(20));
            }
            return;
        }
    };
    let _ = write!(
        conn,
        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n{extra}\r\n{body}",
        body.len()
    );
}

fn env() -> Env {
    Env::new(common::runtime(), common::cache(), EnvConfig::default()).unwrap()
}

fn play(env: &mut Env, plan: &Plan, cfg: &LlmConfig) -> engine::episode::Played {
    let first = env.reset(plan).unwrap();
    let mut agent = LlmAgent::new(cfg).unwrap();
    engine::episode::play(env, &first, &mut agent, &mut |_, _| {}).unwrap()
}

/// An environment reset to archive-logs at `seed`: the plan, the task and its oracle commands.
fn oracle_of(seed: u64) -> (Env, Plan, engine::instance::TaskSetup, Vec<String>) {
    let mut env = env();
    let plan = Plan::for_task("archive-logs", seed, vec![]);
    env.reset(&plan).unwrap();
    let setup = env.task().cloned().unwrap();
    let oracle = engine::tasks::get("archive-logs").unwrap().oracle(&setup);
    (env, plan, setup, oracle)
}

#[test]
fn a_model_solves_through_rate_limits_bad_bodies_and_a_reply_without_a_command() {
    if !common::is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let (mut env, plan, setup, oracle) = oracle_of(3);
    // A look around, then the task's oracle solution.
    let mut commands = vec!["ls -la".to_string()];
    commands.extend(oracle);
    // 0: rate limited (Retry-After 0), 1: the first command, 2: an unreadable body, 3: a
    // reply without a command, 4..: the other commands, then DONE.
    let script = {
        let commands = commands.clone();
        move |n: usize| match n {
            0 => Answer::Status(429, Some("0")),
            1 => command(&commands[0]),
            2 => Answer::Body("<html>busy</html>"),
            3 => says("I think the logs should be archived next."),
            n if n - 3 < commands.len() => command(&commands[n - 3]),
            _ => says("DONE"),
        }
    };
    let server = FakeChat::start(script);
    let played = play(&mut env, &plan, &server.config());
    assert!(played.success, "{played:?}");
    assert_eq!(played.agent_failure, None);
    assert!(!played.infra);
    assert_eq!(played.steps as usize, commands.len());

    let t = played.transcript.expect("an llm agent keeps a transcript");
    assert_eq!(t.model, "fake-model");
    assert_eq!(
        t.endpoint,
        format!("{}/chat/completions", server.base_url())
    );
    assert_eq!(t.messages[0].role, "system");
    assert!(t.messages[0].content.contains(&setup.instruction));
    assert!(t.messages[0].content.contains("```sh"));
    let taken: Vec<&str> = t
        .turns
        .iter()
        .filter_map(|t| t.command.as_deref())
        .collect();
    assert_eq!(
        taken,
        commands.iter().map(String::as_str).collect::<Vec<_>>()
    );
    let outcomes = |i: usize| -> Vec<&str> {
        t.turns[i]
            .attempts
            .iter()
            .map(|a| a.outcome.as_str())
            .collect()
    };
    assert_eq!(outcomes(0), ["http 429", "ok"]);
    assert_eq!(
        t.turns[0].attempts[0].wait_ms,
        Some(0.0),
        "Retry-After: 0 is honoured"
    );
    assert_eq!(outcomes(1).len(), 2);
    assert!(
        outcomes(1)[0].starts_with("bad body: not JSON"),
        "{:?}",
        outcomes(1)
    );
    assert!(t.turns[1].malformed.is_some() && t.turns[1].command.is_none());
    // Every reply that came reported 10 + 5 tokens.
    let replies = server.seen().len() as u64 - 2;
    assert_eq!(t.usage.prompt_tokens, 10 * replies);
    assert_eq!(t.usage.total_tokens, 15 * replies);
    assert_eq!(t.failure, None);

    let seen = server.seen();
    for s in &seen {
        assert!(
            s.head.starts_with("post /v1/chat/completions "),
            "{}",
            s.head
        );
        assert_eq!(s.body["model"], "fake-model");
        if std::env::var_os("OPENAI_API_KEY").is_none() {
            assert!(!s.head.contains("authorization"), "no key was configured");
        }
    }
    // The request after the reply without a command carries it and the correction.
    let after = seen[4].body["messages"].as_array().unwrap();
    let last = after.last().unwrap();
    assert_eq!(last["role"], "user");
    assert!(last["content"]
        .as_str()
        .unwrap()
        .contains("held no command"));
    // The last request sent is the transcript up to its reply.
    let sent = seen.last().unwrap().body["messages"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(sent + 1, t.messages.len());
    // Each observation went to the model: the first has the task.
    assert_eq!(t.messages[1].role, "user");
    assert!(t.messages[1].content.contains("task: "));
}

#[test]
fn endpoints_that_fail_hang_or_never_give_a_command_are_agent_failures() {
    if !common::is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let mut env = env();
    let plan = Plan::for_task("archive-logs", 4, vec![]);
    let agent_failure = |p: &engine::episode::Played, what: &str| {
        let why = p
            .agent_failure
            .as_deref()
            .unwrap_or_else(|| panic!("{p:?}"));
        assert!(why.contains(what), "{why:?} should say {what:?}");
        assert!(!p.infra && !p.success, "{p:?}");
        let t = p.transcript.as_ref().unwrap();
        assert_eq!(
            why,
            format!("language model: {}", t.failure.as_deref().unwrap())
        );
        t.clone()
    };

    // One command, then a server error forever: three requests, then the agent gives up.
    let server = FakeChat::start(|n| {
        if n == 0 {
            command("ls /")
        } else {
            Answer::Status(503, None)
        }
    });
    let mut cfg = server.config();
    cfg.max_retries = 2;
    let p = play(&mut env, &plan, &cfg);
    let t = agent_failure(&p, "gave up after 3 requests (last: http 503)");
    assert_eq!(p.steps, 1);
    assert_eq!(server.seen().len(), 4);
    let waits: Vec<bool> = t.turns[1]
        .attempts
        .iter()
        .map(|a| a.wait_ms.is_some())
        .collect();
    assert_eq!(
        waits,
        [true, true, false],
        "a wait after every attempt but the last"
    );
    drop(server);

    // A server that never answers: each request times out.
    let server = FakeChat::start(|_| Answer::Hang);
    let mut cfg = server.config();
    cfg.timeout = "300ms".into();
    cfg.max_retries = 1;
    let p = play(&mut env, &plan, &cfg);
    let t = agent_failure(&p, "gave up after 2 requests (last: timeout)");
    assert_eq!(p.steps, 0);
    assert!(t.turns[0].attempts.iter().all(|a| a.outcome == "timeout"));
    drop(server);

    // Replies that never hold a command.
    let server = FakeChat::start(|_| says("Let me think about the logs."));
    let mut cfg = server.config();
    cfg.max_malformed = 2;
    let p = play(&mut env, &plan, &cfg);
    let t = agent_failure(&p, "2 replies in a row held no command");
    assert_eq!(t.turns.len(), 2);
    assert_eq!(server.seen().len(), 2);
    drop(server);

    // A refused key is not retried, and it is a mistake of the configuration, not an
    // outcome of the episode: the episode fails with an error (a run would stop), never as
    // a success rate of 0.
    let server = FakeChat::start(|_| Answer::Status(401, None));
    let first = env.reset(&plan).unwrap();
    let mut agent = LlmAgent::new(&server.config()).unwrap();
    let e = engine::episode::play(&mut env, &first, &mut agent, &mut |_, _| {}).unwrap_err();
    assert!(e.to_string().contains("HTTP 401"), "{e}");
    assert_eq!(server.seen().len(), 1);
    drop(server);

    // The environment is unharmed: the next episode, by another agent, solves.
    let first = env.reset(&plan).unwrap();
    let mut oracle = engine::agents::Oracle::default();
    let p = engine::episode::play(&mut env, &first, &mut oracle, &mut |_, _| {}).unwrap();
    assert!(p.success && p.transcript.is_none());
}

#[test]
fn episode_and_run_keep_the_transcript_and_the_key_stays_out_of_it() {
    if !common::is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let st = common::TempState::new();
    let server = FakeChat::start(|n| {
        if n == 0 {
            command("echo hello")
        } else {
            says("DONE")
        }
    });
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_engine"))
        .env("ENVFACTORY_STATE", st.path())
        .env("ENVFACTORY_TEST_LLM_KEY", "sekrit-test-key-123")
        .args([
            "episode",
            "--task",
            "archive-logs",
            "--seed",
            "2",
            "--agent",
            "llm",
            "--json",
        ])
        .args([
            "--llm-base-url",
            &server.base_url(),
            "--llm-model",
            "fake-model",
        ])
        .args(["--llm-api-key-env", "ENVFACTORY_TEST_LLM_KEY"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert_eq!(lines[0]["action"], "echo hello");
    let last = &lines[1];
    assert_eq!(last["agent"], "llm fake-model");
    assert_eq!(last["agent_failure"], false);
    assert_eq!(
        last["success"], false,
        "DONE before the goal is an unfinished episode"
    );
    let turns = last["transcript"]["turns"].as_array().unwrap();
    assert_eq!(turns[0]["command"], "echo hello");
    assert_eq!(turns[1]["done"], true);
    assert_eq!(last["transcript"]["usage"]["total_tokens"], 30);
    for s in server.seen() {
        assert!(s.head.contains("authorization: bearer sekrit-test-key-123"));
    }
    assert!(!stdout.contains("sekrit"), "the key is never recorded");
    // A named key variable that is unset is bad input (2), before any sandbox starts.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_engine"))
        .env("ENVFACTORY_STATE", st.path())
        .args(["episode", "--task", "archive-logs", "--agent", "llm"])
        .args(["--llm-base-url", &server.base_url(), "--llm-model", "m"])
        .args(["--llm-api-key-env", "ENVFACTORY_SURELY_UNSET_VAR"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--llm-api-key-env"));
    drop(server);

    // `engine run` with an endpoint that always fails: agent failures, counted, not masked.
    let server = FakeChat::start(|_| Answer::Status(500, None));
    let root = tempfile::tempdir().unwrap();
    let file = root.path().join("exp.toml");
    std::fs::write(
        &file,
        format!(
            "[experiment]\nname = \"llm\"\nseeds = [1]\nout_dir = \"{}\"\n\
             [environment]\ntask = \"archive-logs\"\nepisodes = 2\nworkers = 1\nagent = \"llm\"\n\
             [llm]\nbase_url = \"{}\"\nmodel = \"fake-model\"\nmax_retries = 1\nbackoff = \"1ms\"\n",
            root.path().join("out").display(),
            server.base_url()
        ),
    )
    .unwrap();
    let exp = engine::experiment::Experiment::load(&file).unwrap();
    let cache = engine::synth::Cache::open_with(st.path(), 64, 1 << 30).unwrap();
    let (report, _) = engine::experiment::run(&exp, &common::runtime(), &cache).unwrap();
    assert_eq!(report.seeds[0].agent_failures, 2);
    assert_eq!(report.seeds[0].infra_failures, 0);
    assert_eq!(report.seeds[0].success_rate, 0.0);
    let records = std::fs::read_to_string(&report.episodes_file).unwrap();
    for l in records.lines() {
        let r: serde_json::Value = serde_json::from_str(l).unwrap();
        assert_eq!(r["agent_failure"], true, "{r}");
        assert_eq!(r["infra"], false);
        assert!(r["error"]
            .as_str()
            .unwrap()
            .contains("gave up after 2 requests"));
        assert_eq!(
            r["transcript"]["turns"][0]["attempts"]
                .as_array()
                .unwrap()
                .len(),
            2
        );
    }
    // An `llm` agent without its table, and a table for another agent, are located errors.
    let bad = file.with_file_name("bad.toml");
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&bad, text.split("[llm]").next().unwrap()).unwrap();
    let e = engine::experiment::Experiment::load(&bad)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("key `environment.agent`: `llm` needs an `[llm]` table"),
        "{e}"
    );
    std::fs::write(
        &bad,
        text.replace("backoff = \"1ms\"", "timeout = \"soon\""),
    )
    .unwrap();
    let e = engine::experiment::Experiment::load(&bad)
        .unwrap_err()
        .to_string();
    assert!(e.contains("key `llm.timeout`"), "{e}");
}

/// A Harbor task folder (`engine harbor run --agent llm`): the model is told the instruction
/// only (never the tests or the oracle), its commands run in the task's sandbox, and the
/// task's own tests judge; a model that says DONE at once scores 0.
#[test]
fn a_model_solves_a_harbor_task_folder_judged_by_its_own_tests() {
    if !common::is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let rt = common::runtime();
    let state = common::TempState::new();
    let store = engine::harbor::LayerStore::open(state.path()).unwrap();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/harbor/harbor/hello-file");
    let host = engine::harbor::BuildOptions::on(sandbox::RootfsSpec::Host);
    let run = |script: fn(usize) -> Answer| {
        let server = FakeChat::start(script);
        let agent = LlmAgent::new(&server.config()).unwrap();
        let agent = engine::harbor::Agent::Llm(Arc::new(Mutex::new(agent)), 5);
        let o = engine::harbor::check_task(&rt, &rt, &store, &dir, &host, &agent, &[], 1).unwrap();
        (o, server.seen())
    };
    let (o, seen) = run(|n| match n {
        0 => command("tr a-z A-Z < word.txt > hello.txt"),
        _ => says("DONE"),
    });
    assert_eq!(o.reward, 1.0, "{o:?}");
    assert!(
        o.reason.contains("said DONE after 1 commands"),
        "{}",
        o.reason
    );
    let first = seen[0].body.to_string();
    assert!(first.contains("upper-cased"), "{first}");
    // Neither the tests nor the oracle.
    assert!(!first.contains("grep -qx HELLO"), "{first}");
    assert!(
        !first.contains("/app/word.txt > \\\"$GREETING_FILE"),
        "{first}"
    );
    // The second request shows the command's result.
    assert!(
        seen[1].body.to_string().contains("exit status 0"),
        "{}",
        seen[1].body
    );
    let (o, _) = run(|_| says("DONE"));
    assert_eq!(o.reward, 0.0, "{o:?}");
}

/// Characters a request carries of its conversation, counted as the budget counts them
/// (contents, tool-call names and arguments).
fn carried(body: &serde_json::Value) -> usize {
    let msgs: Vec<engine::agents::llm::Message> =
        serde_json::from_value(body["messages"].clone()).unwrap();
    msgs.iter().map(engine::agents::llm::Message::chars).sum()
}

#[test]
fn a_long_episode_stays_within_the_context_budget_and_the_transcript_keeps_everything() {
    if !common::is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let cfg = EnvConfig {
        max_steps: Some(30),
        ..EnvConfig::default()
    };
    let mut env = Env::new(common::runtime(), common::cache(), cfg).unwrap();
    let plan = Plan::for_task("archive-logs", 5, vec![]);
    // 30 commands, each with a long output (its observation cut to head and tail), then the
    // step limit.
    let server = FakeChat::start(|n| command(&format!("echo mark-{n}; seq 100000 102000")));
    let budget = 6000;
    let mut llm = server.config();
    llm.max_context_chars = budget;
    llm.max_observation_chars = 1500;
    let played = play(&mut env, &plan, &llm);
    assert_eq!(played.steps, 30, "{played:?}");
    assert!(
        !played.infra && played.agent_failure.is_none(),
        "{played:?}"
    );
    let t = played.transcript.unwrap();
    let seen = server.seen();
    assert_eq!(seen.len(), 30);
    // Every request within the budget; the system prompt first; the latest observation last.
    let mut noted = 0;
    for (n, s) in seen.iter().enumerate() {
        assert!(
            carried(&s.body) <= budget,
            "request {n}: {}",
            carried(&s.body)
        );
        let msgs = s.body["messages"].as_array().unwrap();
        assert_eq!(msgs[0], serde_json::to_value(&t.messages[0]).unwrap());
        let last = msgs.last().unwrap()["content"].as_str().unwrap();
        if n > 0 {
            assert!(
                last.contains(&format!("mark-{}", n - 1)),
                "request {n}: {last}"
            );
            assert!(
                last.contains("characters cut"),
                "the long output is cut: {last}"
            );
            assert!(last.contains("disk /:"), "its tail is kept: {last}");
        }
        let note = msgs[1]["content"].as_str().unwrap();
        if note.contains("earlier messages") {
            noted += 1;
            assert!(
                note.contains("left out to fit the context budget"),
                "{note}"
            );
            assert_eq!(msgs[2]["role"], "assistant", "whole turns are left out");
        }
        // What the request carried is rebuilt from the transcript and the turn's window.
        let w = t.turns[n].context.unwrap();
        let rebuilt = engine::agents::llm::context::sent(&t.messages, &w, budget);
        assert_eq!(serde_json::to_value(&rebuilt).unwrap(), s.body["messages"]);
        assert_eq!(w.chars, carried(&s.body));
    }
    assert!(
        noted >= 20,
        "the long episode was cut: {noted} requests with the note"
    );
    assert_eq!(seen[0].body["messages"].as_array().unwrap().len(), 2);
    // The transcript keeps every message: the system prompt, the 30 observations the model
    // was asked about (the one after the limit is not), its 30 replies.
    assert_eq!(t.messages.len(), 1 + 30 + 30);
    assert!(t.messages.iter().any(|m| m.content.contains("mark-0")));
}

#[test]
fn a_model_acting_through_tool_calls_solves_and_its_malformed_calls_are_retried() {
    if !common::is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let (mut env, plan, _, oracle) = oracle_of(3);
    let bad_json = Answer::Calls(
        "Let me look.",
        serde_json::json!([{"id": "b1", "type": "function",
                            "function": {"name": "run_command", "arguments": "{\"command\": "}}]),
    );
    let two = Answer::Calls(
        "",
        serde_json::json!([
            {"id": "t1", "type": "function", "function": {"name": "run_command", "arguments": "{\"command\":\"ls\"}"}},
            {"id": "t2", "type": "function", "function": {"name": "run_command", "arguments": "{\"command\":\"pwd\"}"}}]),
    );
    let unknown = Answer::Calls(
        "",
        serde_json::json!([{"id": "u1", "type": "function",
                            "function": {"name": "delete_everything", "arguments": "{}"}}]),
    );
    // 0: a call, 1: bad JSON, 2: two calls, 3: a call, 4: an unknown function, 5: a fenced
    // block (still understood), then the oracle's commands as calls (the task is solved).
    let script = {
        let oracle = oracle.clone();
        move |n: usize| match n {
            0 => tool_call("call-0", "ls -la"),
            1 => bad_json.clone(),
            2 => two.clone(),
            3 => tool_call("call-3", "true"),
            4 => unknown.clone(),
            5 => command("pwd"),
            n if n - 6 < oracle.len() => tool_call(&format!("call-{n}"), &oracle[n - 6]),
            _ => says("DONE"),
        }
    };
    let server = FakeChat::start(script);
    let mut cfg = server.config();
    cfg.tools = true;
    let played = play(&mut env, &plan, &cfg);
    assert!(played.success, "{played:?}");
    assert!(played.agent_failure.is_none() && !played.infra);
    let t = played.transcript.unwrap();
    let malformed: Vec<&str> = t
        .turns
        .iter()
        .filter_map(|t| t.malformed.as_deref())
        .collect();
    assert_eq!(malformed.len(), 3, "{malformed:?}");
    assert!(malformed[0].contains("not JSON"), "{malformed:?}");
    assert!(malformed[1].contains("2 tool calls"), "{malformed:?}");
    assert!(malformed[2].contains("unknown function `delete_everything`"));
    let by_tool: Vec<bool> = t
        .turns
        .iter()
        .filter(|t| t.command.is_some())
        .map(|t| t.tool_call)
        .collect();
    assert_eq!(by_tool.len(), 3 + oracle.len());
    assert!(!by_tool[2], "the fenced block is still understood");
    assert!(by_tool.iter().enumerate().all(|(i, b)| *b == (i != 2)));
    assert!(t.messages[0].content.contains("run_command"));

    let seen = server.seen();
    for (n, s) in seen.iter().enumerate() {
        assert_eq!(s.body["tool_choice"], "auto");
        assert_eq!(s.body["tools"][0]["function"]["name"], "run_command");
        // Every call sent back is answered by a tool message with its id, and only valid
        // calls are sent back as calls.
        let msgs = s.body["messages"].as_array().unwrap();
        for (i, m) in msgs.iter().enumerate() {
            if let Some(calls) = m["tool_calls"].as_array() {
                assert_eq!(calls.len(), 1, "request {n}");
                let id = calls[0]["id"].as_str().unwrap();
                assert!(id.starts_with("call-"), "request {n}: {id}");
                assert_eq!(msgs[i + 1]["role"], "tool", "request {n}");
                assert_eq!(msgs[i + 1]["tool_call_id"], id, "request {n}");
            }
        }
    }
    // The observation of the first call answers it.
    let second = seen[1].body["messages"].as_array().unwrap();
    let answer = second.last().unwrap();
    assert_eq!(answer["role"], "tool");
    assert_eq!(answer["tool_call_id"], "call-0");
    assert!(answer["content"].as_str().unwrap().contains("ls -la"));
    // The reply with bad JSON is kept as text with a correction after it.
    let third = seen[2].body["messages"].as_array().unwrap();
    let n = third.len();
    assert_eq!(third[n - 2]["role"], "assistant");
    assert!(third[n - 2]["content"]
        .as_str()
        .unwrap()
        .contains("[tool calls:"));
    assert!(third[n - 2].get("tool_calls").is_none());
    assert!(third[n - 1]["content"]
        .as_str()
        .unwrap()
        .contains("Call run_command once"));
}

#[test]
fn malformed_tool_calls_end_as_agent_failures_and_calls_need_tools_offered() {
    if !common::is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let mut env = env();
    let plan = Plan::for_task("archive-logs", 4, vec![]);
    let server = FakeChat::start(|n| {
        Answer::Calls(
            "",
            serde_json::json!([{"id": format!("x{n}"), "type": "function",
                                "function": {"name": "run_command", "arguments": "not json"}}]),
        )
    });
    let mut cfg = server.config();
    cfg.tools = true;
    cfg.max_malformed = 2;
    let p = play(&mut env, &plan, &cfg);
    let why = p.agent_failure.as_deref().expect("an agent failure");
    assert!(why.contains("2 replies in a row held no command"), "{why}");
    assert!(why.contains("not JSON"), "{why}");
    assert!(!p.infra && !p.success && p.steps == 0);
    drop(server);

    // Without tools offered, a call is not a command (and no `tools` are sent).
    let server = FakeChat::start(|_| tool_call("c", "ls"));
    let mut cfg = server.config();
    cfg.max_malformed = 1;
    let p = play(&mut env, &plan, &cfg);
    let why = p.agent_failure.as_deref().expect("an agent failure");
    assert!(why.contains("no tools are offered"), "{why}");
    assert!(!p.infra);
    assert!(server.seen()[0].body.get("tools").is_none());
}
